"""Admin pages for the jobs' data; the schedule itself is django-celery-beat's admin."""

from django.contrib import admin

from .models import AnalyticsSnapshot, Broadcast, JobRun, Message


@admin.register(Broadcast)
class BroadcastAdmin(admin.ModelAdmin):
    list_display = ("subject", "send_at", "sent_at", "times_sent")
    readonly_fields = ("sent_at", "times_sent")


@admin.register(JobRun)
class JobRunAdmin(admin.ModelAdmin):
    list_display = ("job", "periodic_task", "slot", "epoch", "ran_at", "detail")
    list_filter = ("job",)


admin.site.register(Message)
admin.site.register(AnalyticsSnapshot)
