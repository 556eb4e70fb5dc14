from django.contrib import admin

from workers.models import Account, Worker


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    list_display = ("name", "trusted", "deadline_limit_ms", "created_at")
    list_filter = ("trusted",)
    search_fields = ("name",)
    fields = ("name", "trusted", "deadline_limit_ms", "created_at")
    readonly_fields = ("created_at",)


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "account",
        "speed",
        "chat",
        "max_length",
        "maintenance",
        "aborted_jobs",
        "last_pop_at",
    )
    list_filter = ("maintenance", "chat")
    list_select_related = ("account",)
    search_fields = ("name",)
    readonly_fields = (
        "speed",
        "speed_samples",
        "completed_jobs",
        "aborted_jobs",
        "uncompleted_jobs",
        "last_pop_at",
    )
    raw_id_fields = ("account",)
