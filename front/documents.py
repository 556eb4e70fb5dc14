"""The operator's documents on the AI Horde's routes: `GET /api/v2/status/news`,
`/api/v2/documents/{terms,privacy,sponsors}` (`base.HordeNews`, `base.DocsTerms`, ...) and
`/.well-known/serviceinfo` (the AI Horde's `routes.serviceinfo`). What they say is what the
operator wrote in the admin (`front.models`); nothing written is an empty answer, still valid."""

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_safe
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from front.models import HordeDocument, Newspiece
from hordeops import errors
from hordeops.serializers import HordeErrorOutput
from hordeops.views import VERSION

API_VERSION = "2.5"  # the AI Horde's HORDE_API_VERSION whose routes these are
FORMATS = ("html", "markdown")
LIMITED = {429: HordeErrorOutput}


# Named in the schema as the AI Horde names them (horde/apis/models/v2.py).
@extend_schema_serializer(component_name="Newspiece")
class NewspieceOutput(serializers.Serializer):
    date_published = serializers.CharField(help_text="The date this newspiece was published (YYYY-MM-DD).")
    newspiece = serializers.CharField(help_text="The actual piece of news.")
    importance = serializers.CharField(help_text="How critical this piece of news is.")
    tags = serializers.ListField(child=serializers.CharField())
    title = serializers.CharField()
    more_info_urls = serializers.ListField(child=serializers.CharField())


@extend_schema_serializer(component_name="HordeDocument")
class HordeDocumentOutput(serializers.Serializer):
    # Empty until the operator writes it.
    html = serializers.CharField(required=False, allow_blank=True, help_text="The document in html format.")
    markdown = serializers.CharField(
        required=False, allow_blank=True, help_text="The document in markdown format."
    )


class QueryFormat(BaseContentNegotiation):
    """JSON always: `format` is the document's own parameter here, not DRF's renderer override."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class NewsView(APIView):
    @extend_schema(
        operation_id="status_news",
        responses={200: NewspieceOutput(many=True), **LIMITED},
        description="The horde's news, newest first, as its moderators wrote it.",
    )
    def get(self, request: Request) -> Response:
        return Response(
            [
                {
                    "date_published": piece.date_published.isoformat(),
                    "newspiece": piece.newspiece,
                    "importance": piece.importance,
                    "tags": piece.tags,
                    "title": piece.title,
                    "more_info_urls": piece.more_info_urls,
                }
                for piece in Newspiece.objects.all()
            ]
        )


FORMAT = OpenApiParameter(
    "format",
    str,
    OpenApiParameter.QUERY,
    required=False,
    enum=FORMATS,
    default="html",
    description="html or markdown",
)


def _document_schema(kind: str, summary: str):
    return extend_schema(
        operation_id=f"documents_{kind}",
        summary=summary,
        parameters=[FORMAT],
        responses={200: HordeDocumentOutput, 400: HordeErrorOutput, **LIMITED},
    )


class DocumentView(APIView):
    """One document in the format asked (`html` by default), the only key of the answer."""

    kind: str = ""
    content_negotiation_class = QueryFormat

    def answer(self, request: Request) -> Response:
        wanted = request.query_params.get("format", "html")
        if wanted not in FORMATS:
            raise errors.BadRequest("'format' needs to be one of ['html', 'markdown']")
        document = HordeDocument.objects.filter(kind=self.kind).first()
        return Response({wanted: getattr(document, wanted) if document else ""})


class TermsView(DocumentView):
    kind = HordeDocument.Kind.TERMS

    @_document_schema(kind, "Terms and Conditions")
    def get(self, request: Request) -> Response:
        return self.answer(request)


class PrivacyView(DocumentView):
    kind = HordeDocument.Kind.PRIVACY

    @_document_schema(kind, "Privacy Policy")
    def get(self, request: Request) -> Response:
        return self.answer(request)


class SponsorsView(DocumentView):
    kind = HordeDocument.Kind.SPONSORS

    @_document_schema(kind, "Sponsors")
    def get(self, request: Request) -> Response:
        return self.answer(request)


@require_safe
def serviceinfo(request: HttpRequest) -> JsonResponse:
    """The AI Horde's `/.well-known/serviceinfo` (version 0.2): what this service is and where
    its API and the API's documentation are. The horde's own address is `HORDE_URL`, else the
    one this request came to."""
    home = settings.HORDE_URL or request.build_absolute_uri("/").rstrip("/")
    software = {"name": settings.HORDE_TITLE, "version": VERSION, "homepage": home}
    # Unset, they are left out rather than sent empty: a client may fetch what it is given.
    if settings.HORDE_REPOSITORY:
        software["repository"] = settings.HORDE_REPOSITORY
    if settings.HORDE_LOGO:
        software["logo"] = settings.HORDE_LOGO
    return JsonResponse(
        {
            "version": "0.2",
            "software": software,
            "api": {
                "aihorde": {
                    "name": "AI Horde API",
                    "version": API_VERSION,
                    "base_url": f"{home}/api/v2",
                    "rel_url": "/api/v2",
                    "documentation": f"{home}/api/",
                },
            },
        }
    )
