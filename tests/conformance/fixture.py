"""The conformance suite's fixtures (tools, resources, prompts and a
completion), served by a brmcp Harness.

Names, arguments and result shapes follow the server scenarios of
``@modelcontextprotocol/conformance`` 0.1.16 (their descriptions under
``dist/index.js``). Handlers reach the agent through the bot's MCP session
(``ctx.request``, the SDK ``ServerRequestContext``): log notifications,
progress, sampling and elicitation travel as PMs to the bridge, which relays
them to the agent's HTTP stream.

A few tools are priced (:data:`PRICES`) so the suite's calls also run the
bridge's payment loop (``payment_required`` → tip → credit → reissue).
Resources, prompts and the completion are free; the bridge mirrors them
live (``register_fixture_catalog``).
"""

from __future__ import annotations

import io
import json
import struct
import wave
import zlib
from base64 import b64encode
from typing import Any

import anyio
from mcp.server import ServerRequestContext
from mcp.shared.message import ServerMessageMetadata
from mcp.types import (
    AudioContent,
    CallToolResult,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmbeddedResource,
    ImageContent,
    LoggingLevel,
    LoggingMessageNotification,
    LoggingMessageNotificationParams,
    SamplingMessage,
    TextContent,
    TextResourceContents,
)

from brmcp.server import CallContext, Harness, PeerContext

__all__ = [
    "CITIES",
    "PRICES",
    "SIMPLE_TEXT",
    "STATIC_TEXT",
    "WATCHED_URI",
    "register_fixture_catalog",
    "register_fixture_tools",
    "tiny_png",
    "tiny_wav",
]

#: Atoms charged per call for the priced fixture tools.
PRICES: dict[str, int] = {"test_simple_text": 7, "test_image_content": 11, "test_tool_with_progress": 13}
SIMPLE_TEXT = "This is a simple text response for testing."
STATIC_TEXT = "This is the content of the static text resource."
#: The resource the subscribe/unsubscribe scenarios watch.
WATCHED_URI = "test://watched-resource"
#: What ``arg1`` of ``test_prompt_with_arguments`` completes from (by prefix).
CITIES = ("paris", "park", "party", "prague", "porto")
ERROR_TEXT = "This tool intentionally returns an error for testing"

_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def tiny_png() -> bytes:
    """A valid 1x1 red RGB PNG, built from its chunks."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit, truecolour
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter byte + one red pixel
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def tiny_wav() -> bytes:
    """A valid mono 8 kHz 16-bit WAV holding 10 ms of silence."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\x00\x00" * 80)
    return buffer.getvalue()


def _request(ctx: CallContext) -> ServerRequestContext[Any]:
    request = ctx.request
    if not isinstance(request, ServerRequestContext):
        raise RuntimeError("this tool needs a live MCP request")
    return request


async def _log(request: ServerRequestContext[Any], level: LoggingLevel, text: str) -> None:
    notification = LoggingMessageNotification(
        params=LoggingMessageNotificationParams(level=level, data=text, logger="conformance-fixture")
    )
    await request.session.send_notification(notification, related_request_id=request.request_id)


async def _elicit(ctx: CallContext, message: str, schema: dict[str, Any]) -> ElicitResult:
    request = _request(ctx)
    return await request.session.send_request(
        ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema)),
        ElicitResult,
        metadata=ServerMessageMetadata(related_request_id=request.request_id),
    )


def _elicitation_text(result: ElicitResult) -> str:
    content = json.dumps(result.content, separators=(",", ":"), sort_keys=True)
    return f"Elicitation completed: action={result.action}, content={content}"


async def simple_text(ctx: CallContext, args: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=SIMPLE_TEXT)])


async def image_content(ctx: CallContext, args: dict[str, Any]) -> CallToolResult:
    data = b64encode(tiny_png()).decode()
    return CallToolResult(content=[ImageContent(type="image", data=data, mime_type="image/png")])


async def audio_content(ctx: CallContext, args: dict[str, Any]) -> CallToolResult:
    data = b64encode(tiny_wav()).decode()
    return CallToolResult(content=[AudioContent(type="audio", data=data, mime_type="audio/wav")])


async def embedded_resource(ctx: CallContext, args: dict[str, Any]) -> CallToolResult:
    resource = TextResourceContents(
        uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
    )
    return CallToolResult(content=[EmbeddedResource(type="resource", resource=resource)])


async def multiple_content_types(ctx: CallContext, args: dict[str, Any]) -> CallToolResult:
    resource = TextResourceContents(
        uri="test://mixed-content-resource",
        mime_type="application/json",
        text=json.dumps({"test": "data", "value": 123}),
    )
    return CallToolResult(
        content=[
            TextContent(type="text", text="Multiple content types test:"),
            ImageContent(type="image", data=b64encode(tiny_png()).decode(), mime_type="image/png"),
            EmbeddedResource(type="resource", resource=resource),
        ]
    )


async def tool_with_logging(ctx: CallContext, args: dict[str, Any]) -> str:
    request = _request(ctx)
    await _log(request, "info", "Tool execution started")
    await anyio.sleep(0.05)
    await _log(request, "info", "Tool processing data")
    await anyio.sleep(0.05)
    await _log(request, "info", "Tool execution completed")
    return "Tool with logging executed successfully"


async def tool_with_progress(ctx: CallContext, args: dict[str, Any]) -> str:
    request = _request(ctx)
    for step, value in enumerate((0.0, 50.0, 100.0)):
        if step:
            await anyio.sleep(0.05)
        await request.session.report_progress(value, 100.0, f"step {step + 1} of 3")
    return "Progress tool completed"


async def error_handling(ctx: CallContext, args: dict[str, Any]) -> str:
    raise RuntimeError(ERROR_TEXT)


async def sampling(ctx: CallContext, args: dict[str, Any]) -> str:
    request = _request(ctx)
    params = CreateMessageRequestParams(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=str(args["prompt"])))],
        max_tokens=100,
    )
    result = await request.session.send_request(
        CreateMessageRequest(params=params),
        CreateMessageResult,
        metadata=ServerMessageMetadata(related_request_id=request.request_id),
    )
    content = result.content
    text = content.text if isinstance(content, TextContent) else json.dumps(content.model_dump(mode="json"))
    return f"LLM response: {text}"


async def elicitation(ctx: CallContext, args: dict[str, Any]) -> str:
    schema = {
        "type": "object",
        "properties": {
            "username": {"type": "string", "description": "User's response"},
            "email": {"type": "string", "description": "User's email address"},
        },
        "required": ["username", "email"],
    }
    result = await _elicit(ctx, str(args["message"]), schema)
    content = json.dumps(result.content, separators=(",", ":"), sort_keys=True)
    return f"User response: action={result.action}, content={content}"


async def elicitation_defaults(ctx: CallContext, args: dict[str, Any]) -> str:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {
                "type": "string",
                "description": "User status",
                "enum": ["active", "inactive", "pending"],
                "default": "active",
            },
            "verified": {"type": "boolean", "description": "Verification status", "default": True},
        },
        "required": [],
    }
    return _elicitation_text(await _elicit(ctx, "Please review and update the form fields", schema))


async def elicitation_enums(ctx: CallContext, args: dict[str, Any]) -> str:
    schema = {
        "type": "object",
        "properties": {
            "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
            "titledSingle": {
                "type": "string",
                "oneOf": [
                    {"const": "value1", "title": "First Option"},
                    {"const": "value2", "title": "Second Option"},
                    {"const": "value3", "title": "Third Option"},
                ],
            },
            "legacyEnum": {
                "type": "string",
                "enum": ["opt1", "opt2", "opt3"],
                "enumNames": ["Option One", "Option Two", "Option Three"],
            },
            "untitledMulti": {
                "type": "array",
                "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
            },
            "titledMulti": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {"const": "value1", "title": "First Choice"},
                        {"const": "value2", "title": "Second Choice"},
                        {"const": "value3", "title": "Third Choice"},
                    ]
                },
            },
        },
        "required": [],
    }
    return _elicitation_text(await _elicit(ctx, "Please choose your options", schema))


async def json_schema_tool(ctx: CallContext, args: dict[str, Any]) -> str:
    return f"received: {json.dumps(args, sort_keys=True)}"


async def reconnection(ctx: CallContext, args: dict[str, Any]) -> str:
    # The bot cannot close the agent's HTTP stream (that lives in the bridge):
    # it answers after a short delay, like the reference fixture's happy path.
    await anyio.sleep(0.1)
    return "Reconnection test completed"


JSON_SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


def register_fixture_tools(harness: Harness) -> None:
    """Register every fixture tool of the server scenarios on ``harness``;
    the tools in :data:`PRICES` are priced in atoms, the rest are free."""

    def add(name: str, handler: Any, description: str, schema: dict[str, Any] | None = None) -> None:
        harness.add_tool(
            name,
            handler,
            description=description,
            input_schema=schema or _EMPTY_OBJECT,
            price_atoms=PRICES.get(name, 0),
        )

    add("test_simple_text", simple_text, "Returns simple text content")
    add("test_image_content", image_content, "Returns a 1x1 PNG image")
    add("test_audio_content", audio_content, "Returns a short WAV clip")
    add("test_embedded_resource", embedded_resource, "Returns an embedded text resource")
    add("test_multiple_content_types", multiple_content_types, "Returns text, image and resource content")
    add("test_tool_with_logging", tool_with_logging, "Sends three info log messages while it runs")
    add("test_tool_with_progress", tool_with_progress, "Reports progress 0, 50 and 100 of 100")
    add("test_error_handling", error_handling, "Always fails with an error result")
    prompt_schema = {
        "type": "object",
        "properties": {"prompt": {"type": "string", "description": "The prompt to send to the LLM"}},
        "required": ["prompt"],
    }
    add("test_sampling", sampling, "Asks the client's LLM to complete a prompt", prompt_schema)
    message_schema = {
        "type": "object",
        "properties": {"message": {"type": "string", "description": "The message to show the user"}},
        "required": ["message"],
    }
    add("test_elicitation", elicitation, "Asks the user for a username and e-mail", message_schema)
    add("test_elicitation_sep1034_defaults", elicitation_defaults, "Elicitation with default values")
    add("test_elicitation_sep1330_enums", elicitation_enums, "Elicitation with every enum variant")
    add(
        "json_schema_2020_12_tool",
        json_schema_tool,
        "Tool with JSON Schema 2020-12 features",
        JSON_SCHEMA_2020_12,
    )
    add("test_reconnection", reconnection, "Answers after a short delay (SSE polling scenario)")


def register_fixture_catalog(harness: Harness) -> None:
    """Register the resources, resource template, prompts and completion of
    the server scenarios (``resources-*``, ``prompts-*``,
    ``completion-complete``) on ``harness``, with the decorator API."""

    @harness.resource("test://static-text", name="static-text", mime_type="text/plain")
    async def static_text(ctx: PeerContext) -> str:
        """A fixed text resource."""
        return STATIC_TEXT

    @harness.resource("test://static-binary", name="static-binary", mime_type="image/png")
    async def static_binary(ctx: PeerContext) -> bytes:
        """A 1x1 PNG image."""
        return tiny_png()

    @harness.resource(WATCHED_URI, name="watched-resource", mime_type="text/plain")
    async def watched(ctx: PeerContext) -> str:
        """A resource clients may subscribe to."""
        return "Watched resource content"

    @harness.resource_template(
        "test://template/{id}/data", name="template-data", mime_type="application/json"
    )
    async def template_data(ctx: PeerContext, id: str) -> dict[str, Any]:
        """Data for one id, substituted from the URI."""
        return {"id": id, "templateTest": True, "data": f"Data for ID: {id}"}

    @harness.prompt()
    async def test_simple_prompt(ctx: PeerContext) -> str:
        """A prompt without arguments."""
        return "This is a simple prompt for testing."

    @harness.prompt()
    async def test_prompt_with_arguments(ctx: PeerContext, arg1: str, arg2: str) -> str:
        """A prompt with two required arguments."""
        return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"

    @harness.prompt()
    async def test_prompt_with_embedded_resource(ctx: PeerContext, resourceUri: str) -> list[Any]:
        """A prompt embedding the resource named by its argument."""
        resource = TextResourceContents(
            uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
        )
        return [
            EmbeddedResource(type="resource", resource=resource),
            "Please process the embedded resource above.",
        ]

    @harness.prompt()
    async def test_prompt_with_image(ctx: PeerContext) -> list[Any]:
        """A prompt carrying an image."""
        image = ImageContent(type="image", data=b64encode(tiny_png()).decode(), mime_type="image/png")
        return [image, "Please analyze the image above."]

    @harness.completion(prompt="test_prompt_with_arguments", argument="arg1")
    async def complete_arg1(ctx: PeerContext, value: str, context: dict[str, str]) -> list[str]:
        return [city for city in CITIES if city.startswith(value)]
