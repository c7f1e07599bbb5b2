"""The admin is the project's only page: operators edit the schedule there, and see zkbeat's view of it
(zkbeat.contrib.admin, in INSTALLED_APPS: its pages live under admin/ and need no URL of their own)."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
