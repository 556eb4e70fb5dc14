from django.urls import path, re_path

from kudos import views

urlpatterns = [
    path("find_user", views.FindUserView.as_view(), name="find-user"),
    re_path(r"^users/(?P<user_id>[^/]*)$", views.UserView.as_view(), name="user"),
    path("kudos/transfer", views.KudosTransferView.as_view(), name="kudos-transfer"),
]
