"""The admin classes: django-celery-beat's periodic task admin with zkbeat's columns and actions, and the
cluster page.

The admin's autodiscovery imports this module; it replaces the admin
django-celery-beat registered for ``PeriodicTask`` on the default site with
:class:`ZkbeatPeriodicTaskAdmin` (a subclass: everything django-celery-beat
shows stays), whatever the order of the two apps in ``INSTALLED_APPS``. A
project with its own admin site registers the classes there itself.

The actions go through zkbeat.ledger.controls, as ``zkbeat pause``, ``resume`` and
``trigger`` do: a pause is a compare-and-set on the row's ledger znode that
the leader's next fenced claim sees, a run now a request the leader consumes
in the fenced claim that records it. Like the command without ``--force``,
they refuse to write layout-2 state while no replica in line reads it (the
guard inside zkbeat.ledger.controls.pause and request_trigger). They need the change
permission on periodic tasks; the cluster page needs the view (or change) permission.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone as django_timezone
from django.utils.html import format_html
from django_celery_beat import admin as beat_admin
from django_celery_beat.models import PeriodicTask

from ...coordination.layout import LAYOUT_DIR
from ...ledger import controls
from ...ops.status import ClusterStatus, read_election
from . import zookeeper
from .models import Cluster
from .rows import ZOOKEEPER_ERRORS, Page, RowView, read_page

__all__ = ["ZkbeatPeriodicTaskAdmin", "ClusterAdmin", "ZkbeatActionForm"]

logger = logging.getLogger(__name__)

_COLUMNS = ("zkbeat_last_run", "zkbeat_next_run", "zkbeat_paused")
#: What a zkbeat column shows when ZooKeeper could not be read for the page.
UNAVAILABLE = "unavailable"


def _when(moment: datetime | str | None) -> str:
    """A time as the page shows it: in Django's current time zone, to the second."""
    if moment is None:
        return "?"
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return django_timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z")


def _stamp(text: str | None) -> str | None:
    """A time from ZooKeeper's JSON, shown as :func:`_when` shows times; as written if it is not one."""
    if not text:
        return text
    try:
        return _when(text)
    except (ValueError, TypeError):
        return text


def _operator(request: HttpRequest) -> str:
    """Who asked, as kept with a pause or a run-now request (the command keeps ``user@host``)."""
    return f"{request.user.get_username()} (Django admin)"


class ZkbeatActionForm(ActionForm):
    """The action bar, plus the note a pause keeps (shown by ``zkbeat status`` and here)."""

    note = forms.CharField(
        required=False,
        max_length=controls.MAX_NOTE,
        label="Note (for a pause)",
        widget=forms.TextInput(attrs={"size": 40, "placeholder": "why it is paused"}),
    )


class ZkbeatPeriodicTaskAdmin(beat_admin.PeriodicTaskAdmin):
    """django-celery-beat's admin, with zkbeat's last run, next run and pause, and its controls."""

    action_form = ZkbeatActionForm
    list_display = (*beat_admin.PeriodicTaskAdmin.list_display, *_COLUMNS)
    readonly_fields = (*beat_admin.PeriodicTaskAdmin.readonly_fields, *_COLUMNS)
    actions = (*beat_admin.PeriodicTaskAdmin.actions, "zkbeat_pause", "zkbeat_resume", "zkbeat_run_now")

    # -- the page's rows: read once, in one batch ---------------------------------

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        changelist = super().get_changelist_instance(request)
        shown = list(changelist.result_list)  # evaluates the page's query; the template reuses these objects
        page = read_page(shown)
        for model in shown:
            model._zkbeat_page = page
        return changelist

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None:
            return fieldsets
        return [*fieldsets, ("zkbeat", {"fields": _COLUMNS, "classes": ("extrapretty", "wide")})]

    def _view(self, obj: PeriodicTask) -> RowView | None:
        """The row's zkbeat view (None: unavailable); a change page reads its one row on first use."""
        page: Page | None = getattr(obj, "_zkbeat_page", None)
        if page is None:
            page = obj._zkbeat_page = read_page([obj])
        return page.get(obj.name)

    # -- the columns (also the change page's read-only fields) -----------------------

    @admin.display(description="zkbeat last run")
    def zkbeat_last_run(self, obj: PeriodicTask) -> str:
        view = self._view(obj)
        if view is None:
            return UNAVAILABLE
        if view.unreadable:
            return "unreadable (the ledger holds data zkbeat cannot read)"
        if view.last_run is None or view.state is None or view.state.epoch is None:
            return "never run"  # no state, or only a pause's: every run is recorded under a leader's epoch
        last = view.last_run
        if last["kind"] == "manual":
            what = f"run now ({last['manual']})"
        else:
            what = f"slot {_when(last['slot'])}" + (", caught up" if last["kind"] == "catch-up" else "")
        # The replica is named while its candidate is still in line; a gone one leaves its epoch.
        by = f"by {view.by}, epoch {last['epoch']}" if view.by else f"epoch {last['epoch']}"
        return format_html("{}<br><small>{}; {}</small>", _when(last["published_at"]), what, by)

    @admin.display(description="zkbeat next run")
    def zkbeat_next_run(self, obj: PeriodicTask) -> str:
        view = self._view(obj)
        if view is None:
            return UNAVAILABLE
        if view.no_next is not None:
            return view.no_next
        assert view.next_at is not None
        if view.state is not None and view.state.paused is not None:
            return f"paused (next slot {_when(view.next_at)})"
        due = " (due now)" if view.next_at <= datetime.now(timezone.utc) else ""
        return f"{_when(view.next_at)}{due}"

    @admin.display(description="zkbeat paused")
    def zkbeat_paused(self, obj: PeriodicTask) -> str:
        view = self._view(obj)
        if view is None:
            return UNAVAILABLE
        held = view.state.paused if view.state is not None else None
        if held is None:
            return "no"
        note = format_html(": {}", held.note) if held.note else ""
        return format_html("by {} at {}{}", held.by, _when(held.at), note)

    # -- the actions ----------------------------------------------------------------

    @admin.action(description="Pause cluster-wide (zkbeat)", permissions=["change"])
    def zkbeat_pause(self, request: HttpRequest, queryset: QuerySet) -> None:
        note = request.POST.get("note", "")
        by = _operator(request)

        def pause(client: Any, root: str, row: PeriodicTask) -> str:
            state, changed = controls.pause(client, root, row.name, by, note, scheduled=True)
            held = state.paused
            assert held is not None
            if not changed:
                return f"Already paused: {row.name} (by {held.by} at {_when(held.at)})"
            return f"Paused {row.name} on every replica" + (f" (note: {note})" if note else "")

        self._control(request, queryset, "pause", pause)

    @admin.action(description="Resume (zkbeat)", permissions=["change"])
    def zkbeat_resume(self, request: HttpRequest, queryset: QuerySet) -> None:
        def resume(client: Any, root: str, row: PeriodicTask) -> str:
            state, changed = controls.resume(client, root, row.name, scheduled=True)
            if not changed or state.paused is None:
                return f"Not paused: {row.name}"
            return f"Resumed {row.name} (paused by {state.paused.by} at {_when(state.paused.at)})"

        self._control(request, queryset, "resume", resume)

    @admin.action(description="Run now, once (zkbeat)", permissions=["change"])
    def zkbeat_run_now(self, request: HttpRequest, queryset: QuerySet) -> None:
        by = _operator(request)

        def run_now(client: Any, root: str, row: PeriodicTask) -> str:
            if not row.enabled:
                # The leader schedules enabled rows only: the request would wait, then be refused.
                raise controls.ControlError("the task is disabled: the leader runs enabled tasks only")
            request_path = controls.request_trigger(client, root, row.name, by, scheduled=True)
            name = request_path.rsplit("/", 1)[-1]
            return f"Asked the leader to run {row.name} once now ({name})"

        self._control(request, queryset, "run now", run_now)

    def _control(self, request: HttpRequest, queryset: QuerySet, what: str, act: Any) -> None:
        """Do ``act`` for each selected row; one message per row says how it went.

        Each message starts with a word of its own, not the row's name: the
        admin capitalizes a message's first letter, and names are case-sensitive.
        """
        try:
            found = zookeeper.settings()
            client = zookeeper.client(found)
        except ZOOKEEPER_ERRORS as exc:
            for row in queryset:
                messages.error(request, f"Not done ({what}) for {row.name}: {exc}")
            return
        for row in queryset:
            try:
                done = act(client, found.root, row)
            except controls.ControlError as exc:
                messages.error(request, f"Refused ({what}) for {row.name}: {exc}")
                continue
            except ZOOKEEPER_ERRORS as exc:
                logger.warning("zkbeat admin: %s of %r failed: %r", what, row.name, exc)
                messages.error(request, f"Not done ({what}) for {row.name}: ZooKeeper answered {type(exc).__name__}")
                continue
            logger.info("zkbeat admin: %s: %s", _operator(request), done)
            self.log_change(request, row, f"zkbeat: {done}")
            messages.success(request, done)


class ClusterAdmin(admin.ModelAdmin):
    """The cluster page: leader, candidates and pending run-now requests (zkbeat.ops.status's readers)."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return user.has_perm("django_celery_beat.view_periodictask") or user.has_perm(
            "django_celery_beat.change_periodictask"
        )

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        # Only the page: the model has no table, so no change, history or delete pages.
        opts = self.model._meta
        return [
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name=f"{opts.app_label}_{opts.model_name}_changelist",
            )
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        from django.core.exceptions import PermissionDenied

        if not self.has_view_permission(request):
            raise PermissionDenied
        status, error = _cluster()
        candidates = [
            {**asdict(c), "started_at": _stamp(c.started_at), "leader_since": _stamp(c.leader_since)}
            for c in (status.candidates if status else [])
        ]
        pending = [{**p, "at": _stamp(p.get("at"))} for p in (status.pending if status else [])]
        context = {
            **self.admin_site.each_context(request),
            "title": "zkbeat cluster",
            "opts": self.model._meta,
            "status": status,
            # The line and the requests with their times as the list page shows times.
            "candidates": candidates,
            "leader": candidates[0] if status is not None and status.leader is not None else None,
            "head": candidates[0] if candidates else None,
            "pending": pending,
            "error": error,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/zkbeat_admin/cluster.html", context)


def _cluster() -> tuple[ClusterStatus | None, str | None]:
    """The cluster as zkbeat status reads it (without the ledger), or why it cannot be read."""
    try:
        found = zookeeper.settings()
        client = zookeeper.client(found)
        status = ClusterStatus(root=found.root, hosts=found.hosts)
        base = f"{found.root.rstrip('/')}/{LAYOUT_DIR}"
        if client.exists(base) is None:
            return status, f"{found.root} holds no zkbeat state on {found.hosts} yet: no replica has run under it"
        status.candidates, status.strangers = read_election(client, f"{base}/election")
        status.pending = controls.pending_requests(client, found.root)
        return status, None
    except ZOOKEEPER_ERRORS as exc:
        why = str(exc) or type(exc).__name__
        logger.warning("zkbeat admin: the cluster page is unavailable: %s", why)
        return None, why


def _register(site: admin.AdminSite = admin.site) -> None:
    """Put zkbeat's periodic task admin in place of django-celery-beat's, and the cluster page on ``site``."""
    if site.is_registered(PeriodicTask):
        site.unregister(PeriodicTask)
    site.register(PeriodicTask, ZkbeatPeriodicTaskAdmin)
    if not site.is_registered(Cluster):
        site.register(Cluster, ClusterAdmin)


_register()
