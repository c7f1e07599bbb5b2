"""The admin is the project's only page: operators edit the schedule there."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
