"""``manage.py schedule_broadcast SUBJECT --in SECONDS``: a broadcast from the command line."""

from datetime import timedelta

from django.core.management.base import BaseCommand
from django.utils import timezone

from jobs.models import Broadcast


class Command(BaseCommand):
    help = "Schedule a broadcast (a one-off task) to go out in SECONDS."

    def add_arguments(self, parser) -> None:
        parser.add_argument("subject")
        parser.add_argument("--in", dest="seconds", type=float, default=60.0)
        parser.add_argument("--body", default="")

    def handle(self, subject: str, seconds: float, body: str, **options) -> None:
        broadcast = Broadcast.objects.create(
            subject=subject, body=body, send_at=timezone.now() + timedelta(seconds=seconds)
        )
        self.stdout.write(f"{broadcast.task_name} at {broadcast.send_at.isoformat()}")
