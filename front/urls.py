"""The pages people use (not the admin's): each page's route, added by the page's module."""

from django.urls import path

from front import pages, signup

app_name = "front"

urlpatterns = [
    path("", pages.home, name="home"),
    path("register", signup.register, name="register"),
]
