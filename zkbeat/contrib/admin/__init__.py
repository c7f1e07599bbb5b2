"""zkbeat in the Django admin, for ``zkbeat.DatabaseScheduler`` users: add ``"zkbeat.contrib.admin"`` to
``INSTALLED_APPS`` after ``"django_celery_beat"``.

What it adds (docs/django.md, "The Django admin"):

* on django-celery-beat's periodic task list and change page, zkbeat's view
  of each row beside django-celery-beat's own: its last run from the ledger
  (slot, when, by which replica and epoch), its next run, and its pause;
* the admin actions "pause cluster-wide", "resume" and "run now (once)",
  through the same fenced paths as the ``zkbeat`` command (zkbeat.ledger.controls);
* a zkbeat page with the cluster: leader, candidates, pending run-now requests.

Parts: :mod:`.zookeeper` (settings from the Celery app, one shared client per
process), :mod:`.rows` (what a page's rows show: one batched ledger read),
:mod:`.admin` (the model admins and actions), :mod:`.models` (the unmanaged
model that puts the cluster page on the app index). A project that does not
install the app gets none of it: nothing here is imported by zkbeat itself.
"""
