"""The workers' teams, as moderators see them: renamed or described as the AI Horde lets a
moderator (`PATCH /api/v2/teams/{id}`), deleted (its workers are left without a team). They are
made by trusted accounts through the route, not here."""

from django.contrib import admin
from django.db.models import Count, Q

from front.admin.shown import ModeratedFieldsMixin
from workers.models import Team, Worker


class TeamWorkersInline(admin.TabularInline):
    """Its live workers, shown: a worker's team is its owner's to choose."""

    model = Worker
    fields = ("name", "account", "completed_jobs", "last_pop_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).filter(deleted_at__isnull=True).select_related("account")


@admin.register(Team)
class TeamAdmin(ModeratedFieldsMixin, admin.ModelAdmin):
    list_display = ("name", "owner", "workers_shown", "created_at")
    list_select_related = ("owner",)
    search_fields = ("name", "owner__name")
    ordering = ("name",)
    fields = ("id", "name", "info", "owner", "created_at")
    readonly_fields = ("id", "owner", "created_at")
    moderated_fields = ("name", "info")
    inlines = (TeamWorkersInline,)
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def get_queryset(self, request):
        live = Count("workers", filter=Q(workers__deleted_at__isnull=True))
        return super().get_queryset(request).annotate(live_workers=live)

    @admin.display(description="workers", ordering="live_workers")
    def workers_shown(self, team: Team) -> int:
        return team.live_workers
