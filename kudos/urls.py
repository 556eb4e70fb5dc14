from django.urls import path

from kudos import views

urlpatterns = [
    path("find_user", views.FindUserView.as_view(), name="find-user"),
    path("users", views.UsersView.as_view(), name="users"),
    path("kudos/transfer", views.KudosTransferView.as_view(), name="kudos-transfer"),
]
