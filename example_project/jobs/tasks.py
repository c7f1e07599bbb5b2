"""The jobs. Each does its work and writes a JobRun row, so runs can be counted."""

from __future__ import annotations

from datetime import timedelta

from celery import Task, shared_task
from django.conf import settings
from django.contrib.sessions.models import Session
from django.db.models import F
from django.utils import timezone

from .models import AnalyticsSnapshot, Broadcast, JobRun, Message


def _record(task: Task, job: str, detail: str) -> JobRun:
    request = task.request
    return JobRun.objects.create(
        job=job,
        periodic_task=request.get("periodic_task_name") or "",
        slot=request.get("zkbeat-slot") or "",
        epoch=request.get("zkbeat-epoch"),
        task_id=request.id or "",
        detail=detail,
    )


@shared_task(bind=True, name="jobs.cleanup_messages")
def cleanup_messages(self: Task) -> int:
    """Delete messages older than JOBS_MESSAGE_RETENTION_DAYS."""
    cutoff = timezone.now() - timedelta(days=settings.JOBS_MESSAGE_RETENTION_DAYS)
    deleted, _ = Message.objects.filter(created_at__lt=cutoff).delete()
    _record(self, "cleanup_messages", f"deleted {deleted} messages")
    return deleted


@shared_task(bind=True, name="jobs.aggregate_analytics")
def aggregate_analytics(self: Task) -> int:
    """Count messages and live sessions into an AnalyticsSnapshot."""
    snapshot = AnalyticsSnapshot.objects.create(
        messages=Message.objects.count(),
        active_sessions=Session.objects.filter(expire_date__gte=timezone.now()).count(),
    )
    _record(self, "aggregate_analytics", f"{snapshot.messages} messages, {snapshot.active_sessions} sessions")
    return snapshot.pk


@shared_task(bind=True, name="jobs.expire_sessions")
def expire_sessions(self: Task) -> int:
    """Delete expired Django sessions (what `manage.py clearsessions` does)."""
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    _record(self, "expire_sessions", f"deleted {deleted} sessions")
    return deleted


@shared_task(bind=True, name="jobs.send_broadcast")
def send_broadcast(self: Task, broadcast_id: int) -> int:
    """Send a broadcast to every customer (here: count that it went out)."""
    Broadcast.objects.filter(pk=broadcast_id).update(times_sent=F("times_sent") + 1, sent_at=timezone.now())
    _record(self, "send_broadcast", f"broadcast {broadcast_id}")
    return broadcast_id
