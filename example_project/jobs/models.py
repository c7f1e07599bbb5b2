"""What the jobs work on, and JobRun: one row per execution, so runs can be counted."""

from __future__ import annotations

import json

from django.db import models, transaction
from django.utils import timezone
from django_celery_beat.models import ClockedSchedule, PeriodicTask


class Message(models.Model):
    """A user message; cleanup deletes old ones."""

    body = models.TextField()
    created_at = models.DateTimeField(default=timezone.now, db_index=True)


class AnalyticsSnapshot(models.Model):
    """The aggregation job's output: counts at one moment."""

    taken_at = models.DateTimeField(default=timezone.now)
    messages = models.PositiveIntegerField()
    active_sessions = models.PositiveIntegerField()


class Broadcast(models.Model):
    """A message to every customer at ``send_at``: sent by a one-off task, so exactly once."""

    subject = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    send_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    #: How often it went out; anything but 0 or 1 is the bug zkbeat exists to prevent.
    times_sent = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return self.subject

    @property
    def task_name(self) -> str:
        return f"broadcast {self.pk}: {self.subject}"[:200]

    def save(self, *args, **kwargs) -> None:
        """Saving (in the admin too) schedules the one-off task that sends it."""
        with transaction.atomic():
            super().save(*args, **kwargs)
            if self.sent_at is None:
                self.schedule()

    def schedule(self) -> PeriodicTask:
        clocked, _ = ClockedSchedule.objects.get_or_create(clocked_time=self.send_at)
        task, _ = PeriodicTask.objects.update_or_create(
            name=self.task_name,
            defaults={
                "task": "jobs.send_broadcast",
                "clocked": clocked,
                "one_off": True,
                "enabled": True,
                "args": json.dumps([self.pk]),
            },
        )
        return task


class JobRun(models.Model):
    """One execution of a job, with the zkbeat headers of the message that started it."""

    job = models.CharField(max_length=100)
    #: django-celery-beat's name of the periodic task (the ``periodic_task_name`` header).
    periodic_task = models.CharField(max_length=200, blank=True)
    #: The tick it ran for (``zkbeat-slot``) and the leader's epoch (``zkbeat-epoch``).
    slot = models.CharField(max_length=64, blank=True)
    epoch = models.BigIntegerField(null=True)
    task_id = models.CharField(max_length=64)
    ran_at = models.DateTimeField(default=timezone.now)
    detail = models.CharField(max_length=200, blank=True)

    class Meta:
        indexes = [models.Index(fields=["periodic_task", "slot"])]

    def __str__(self) -> str:
        return f"{self.job} {self.slot}"
