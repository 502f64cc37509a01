"""The MCP conformance suite's "everything server", rebuilt with the official Python SDK.

    python3 conformance_server.py --port N     # Streamable HTTP on http://127.0.0.1:N/mcp
    python3 conformance_server.py --uds PATH   # Streamable HTTP on a Unix socket, /mcp

The *server* scenarios of the official conformance suite
(`conformance server --url http://127.0.0.1:N/mcp --scenario NAME`) expect the
fixtures of its TypeScript reference server, `examples/servers/typescript/
everything-server.ts` in github.com/modelcontextprotocol/conformance. This file
exposes the same names and behaviours through `MCPServer`:

Tools: `test_simple_text`, `test_image_content`, `test_audio_content`,
`test_embedded_resource`, `test_multiple_content_types`, `test_tool_with_logging`
(three info logs, 50 ms apart), `test_tool_with_progress` (0/50/100 of 100),
`test_error_handling` (isError), `test_reconnection` (closes its SSE stream
mid-call, SEP-1699), `test_sampling` (sampling/createMessage),
`test_elicitation`, `test_elicitation_sep1034_defaults`,
`test_elicitation_sep1330_enums` (elicitation/create), and
`json_schema_2020_12_tool` (raw JSON Schema 2020-12 input schema, SEP-1613).
Resources: `test://static-text`, `test://static-binary`,
`test://watched-resource`; template `test://template/{id}/data`.
Prompts: `test_simple_prompt`, `test_prompt_with_arguments`,
`test_prompt_with_embedded_resource`, `test_prompt_with_image`.
Also: `completion/complete` (empty completions), `logging/setLevel` (filters this
session's log notifications), `resources/subscribe` / `resources/unsubscribe`,
an in-memory event store for resumable SSE streams, and DNS rebinding
protection (only localhost / 127.0.0.1 Host and Origin headers are accepted).

`MCPServer` has no decorator for `logging/setLevel` or `resources/subscribe`,
so those two handlers go on its low-level server.
"""

import argparse
import base64
import itertools
import json
import warnings
from collections import deque
from typing import Annotated, Any

import anyio
from mcp_types import (
    AudioContent,
    CallToolResult,
    Completion,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    LoggingLevel,
    SamplingMessage,
    SetLevelRequestParams,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    UnsubscribeRequestParams,
)
from pydantic import BaseModel, Field

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer, UserMessage
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.shared.exceptions import MCPDeprecationWarning

# Logging, sampling and `logging/setLevel` are deprecated as of protocol 2026-07-28,
# but the scenarios exercise them at 2025-06-18 / 2025-11-25.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

# A 1x1 red PNG pixel and a minimal WAV file, as in the reference server.
TEST_IMAGE_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
TEST_AUDIO_BASE64 = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

# SEP-1613: advertised verbatim, so `$schema`, `$defs` and `additionalProperties` survive.
JSON_SCHEMA_2020_12_INPUT_SCHEMA: dict[str, Any] = {
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

LOG_LEVELS: list[LoggingLevel] = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


def compact_json(value: Any) -> str:
    """JSON the way `JSON.stringify` writes it."""
    return json.dumps(value, separators=(",", ":"))


# ===== Per-session state =====

# Keyed by the Mcp-Session-Id header (None when there is none).
log_levels: dict[str | None, LoggingLevel] = {}
subscriptions: dict[str | None, set[str]] = {}


def session_key(request_context: ServerRequestContext[Any]) -> str | None:
    headers = getattr(request_context.request, "headers", None)
    return headers.get("mcp-session-id") if headers is not None else None


async def send_log(request_context: ServerRequestContext[Any], level: LoggingLevel, data: Any) -> None:
    """Send `notifications/message` on the request's stream, unless this session's level filters it out."""
    minimum = log_levels.get(session_key(request_context), "debug")
    if LOG_LEVELS.index(level) < LOG_LEVELS.index(minimum):
        return
    await request_context.session.send_log_message(
        level=level, data=data, logger="conformance-test-server", related_request_id=request_context.request_id
    )


# ===== Resumability (SEP-1699) =====


class InMemoryEventStore(EventStore):
    """Keeps the most recent SSE events so a client can resume a stream with Last-Event-ID."""

    def __init__(self, max_events: int = 10_000) -> None:
        self._events: deque[tuple[EventId, StreamId, Any]] = deque(maxlen=max_events)
        self._counter = itertools.count(1)

    async def store_event(self, stream_id: StreamId, message: Any) -> EventId:
        event_id = f"{stream_id}::{next(self._counter):012d}"
        self._events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        stream_id = next((sid for eid, sid, _ in self._events if eid == last_event_id), None)
        if stream_id is None:
            return None
        found = False
        for event_id, sid, message in list(self._events):
            if event_id == last_event_id:
                found = True
            elif found and sid == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


# ===== Tools =====

# SEP-1613: the tool is built first so its advertised input schema can be replaced
# by the raw 2020-12 one; arguments are still validated from the signature.


class Address(BaseModel):
    street: str | None = None
    city: str | None = None


def json_schema_2020_12_tool(name: str | None = None, address: Address | None = None) -> str:
    """Tool with JSON Schema 2020-12 features for conformance testing (SEP-1613)"""
    args: dict[str, Any] = {}
    if name is not None:
        args["name"] = name
    if address is not None:
        args["address"] = address.model_dump(exclude_none=True)
    return f"JSON Schema 2020-12 tool called with: {compact_json(args)}"


schema_tool = Tool.from_function(json_schema_2020_12_tool, structured_output=False)
schema_tool.parameters = JSON_SCHEMA_2020_12_INPUT_SCHEMA

server = MCPServer("mcp-conformance-test-server", version="1.0.0", tools=[schema_tool])

# Every tool answers with plain content blocks and no outputSchema / structuredContent,
# as the reference server does; hence `structured_output=False` throughout.


@server.tool(structured_output=False)
def test_simple_text() -> str:
    """Tests simple text content response"""
    return "This is a simple text response for testing."


@server.tool(structured_output=False)
def test_image_content() -> CallToolResult:
    """Tests image content response"""
    return CallToolResult(content=[ImageContent(type="image", data=TEST_IMAGE_BASE64, mime_type="image/png")])


@server.tool(structured_output=False)
def test_audio_content() -> CallToolResult:
    """Tests audio content response"""
    return CallToolResult(content=[AudioContent(type="audio", data=TEST_AUDIO_BASE64, mime_type="audio/wav")])


@server.tool(structured_output=False)
def test_embedded_resource() -> CallToolResult:
    """Tests embedded resource content response"""
    resource = TextResourceContents(
        uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
    )
    return CallToolResult(content=[EmbeddedResource(type="resource", resource=resource)])


@server.tool(structured_output=False)
def test_multiple_content_types() -> CallToolResult:
    """Tests response with multiple content types (text, image, resource)"""
    resource = TextResourceContents(
        uri="test://mixed-content-resource",
        mime_type="application/json",
        text=compact_json({"test": "data", "value": 123}),
    )
    return CallToolResult(
        content=[
            TextContent(type="text", text="Multiple content types test:"),
            ImageContent(type="image", data=TEST_IMAGE_BASE64, mime_type="image/png"),
            EmbeddedResource(type="resource", resource=resource),
        ]
    )


@server.tool(structured_output=False)
async def test_tool_with_logging(ctx: Context) -> str:
    """Tests tool that emits log messages during execution"""
    await send_log(ctx.request_context, "info", "Tool execution started")
    await anyio.sleep(0.05)
    await send_log(ctx.request_context, "info", "Tool processing data")
    await anyio.sleep(0.05)
    await send_log(ctx.request_context, "info", "Tool execution completed")
    return "Tool with logging executed successfully"


@server.tool(structured_output=False)
async def test_tool_with_progress(ctx: Context) -> str:
    """Tests tool that reports progress notifications"""
    # A no-op when the caller sent no progress token.
    for step in (0, 50, 100):
        if step:
            await anyio.sleep(0.05)
        await ctx.report_progress(step, 100, f"Completed step {step} of 100")
    return str((ctx.request_context.meta or {}).get("progress_token", 0))


@server.tool(structured_output=False)
def test_error_handling() -> str:
    """Tests error response handling"""
    raise ToolError("This tool intentionally returns an error for testing")


@server.tool(
    structured_output=False,
    description="Tests SSE stream disconnection and client reconnection (SEP-1699). Server will close the "
    "stream mid-call and send the result after client reconnects.",
)
async def test_reconnection(ctx: Context) -> str:
    # Closes this request's SSE stream (a no-op before protocol 2025-11-25); the
    # result is stored in the event store and replayed when the client resumes.
    await ctx.close_sse_stream()
    await anyio.sleep(0.1)
    return (
        "Reconnection test completed successfully. If you received this, "
        "the client properly reconnected after stream closure."
    )


@server.tool(structured_output=False)
async def test_sampling(
    prompt: Annotated[str, Field(description="The prompt to send to the LLM")], ctx: Context
) -> str:
    """Tests server-initiated sampling (LLM completion request)"""
    try:
        result = await ctx.session.create_message(
            messages=[SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
            max_tokens=100,
            related_request_id=ctx.request_context.request_id,
        )
    except Exception as exc:
        return f"Sampling not supported or error: {exc}"
    content = result.content
    text = content.text if isinstance(content, TextContent) else "No response"
    return f"LLM response: {text}"


async def elicit(ctx: Context, message: str, requested_schema: dict[str, Any]) -> tuple[str, str]:
    """Send a raw `elicitation/create` (the schema goes out verbatim); return (action, content JSON)."""
    result = await ctx.session.elicit_form(message, requested_schema, related_request_id=ctx.request_context.request_id)
    return result.action, compact_json(result.content or {})


@server.tool(structured_output=False)
async def test_elicitation(
    message: Annotated[str, Field(description="The message to show the user")], ctx: Context
) -> str:
    """Tests server-initiated elicitation (user input request)"""
    schema = {
        "type": "object",
        "properties": {"response": {"type": "string", "description": "User's response"}},
        "required": ["response"],
    }
    try:
        action, content = await elicit(ctx, message, schema)
    except Exception as exc:
        return f"Elicitation not supported or error: {exc}"
    return f"User response: action={action}, content={content}"


@server.tool(structured_output=False)
async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
    """Tests elicitation with default values per SEP-1034"""
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
    try:
        action, content = await elicit(ctx, "Please review and update the form fields with defaults", schema)
    except Exception as exc:
        return f"Elicitation not supported or error: {exc}"
    return f"Elicitation completed: action={action}, content={content}"


@server.tool(structured_output=False)
async def test_elicitation_sep1330_enums(ctx: Context) -> str:
    """Tests elicitation with enum schema improvements per SEP-1330"""
    schema = {
        "type": "object",
        "properties": {
            # Untitled single-select enum
            "untitledSingle": {
                "type": "string",
                "description": "Select one option",
                "enum": ["option1", "option2", "option3"],
            },
            # Titled single-select enum (oneOf with const/title)
            "titledSingle": {
                "type": "string",
                "description": "Select one option with titles",
                "oneOf": [
                    {"const": "value1", "title": "First Option"},
                    {"const": "value2", "title": "Second Option"},
                    {"const": "value3", "title": "Third Option"},
                ],
            },
            # Legacy titled enum (enumNames, deprecated)
            "legacyEnum": {
                "type": "string",
                "description": "Select one option (legacy)",
                "enum": ["opt1", "opt2", "opt3"],
                "enumNames": ["Option One", "Option Two", "Option Three"],
            },
            # Untitled multi-select enum
            "untitledMulti": {
                "type": "array",
                "description": "Select multiple options",
                "minItems": 1,
                "maxItems": 3,
                "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
            },
            # Titled multi-select enum (items.anyOf with const/title)
            "titledMulti": {
                "type": "array",
                "description": "Select multiple options with titles",
                "minItems": 1,
                "maxItems": 3,
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
    try:
        action, content = await elicit(ctx, "Please select options from the enum fields", schema)
    except Exception as exc:
        return f"Elicitation not supported or error: {exc}"
    return f"Elicitation completed: action={action}, content={content}"


# ===== Resources =====


@server.resource(
    "test://static-text",
    name="static-text",
    title="Static Text Resource",
    description="A static text resource for testing",
    mime_type="text/plain",
)
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource(
    "test://static-binary",
    name="static-binary",
    title="Static Binary Resource",
    description="A static binary resource (image) for testing",
    mime_type="image/png",
)
def static_binary() -> bytes:
    return base64.b64decode(TEST_IMAGE_BASE64)


@server.resource(
    "test://template/{id}/data",
    name="template",
    title="Resource Template",
    description="A resource template with parameter substitution",
    mime_type="application/json",
)
def template(id: str) -> str:
    return compact_json({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


@server.resource(
    "test://watched-resource",
    name="watched-resource",
    title="Watched Resource",
    description="A resource that auto-updates every 3 seconds",
    mime_type="text/plain",
)
def watched_resource() -> str:
    return "Watched resource content"


async def subscribe(ctx: ServerRequestContext[Any], params: SubscribeRequestParams) -> EmptyResult:
    subscriptions.setdefault(session_key(ctx), set()).add(str(params.uri))
    await send_log(ctx, "info", f"Subscribed to resource: {params.uri}")
    return EmptyResult()


async def unsubscribe(ctx: ServerRequestContext[Any], params: UnsubscribeRequestParams) -> EmptyResult:
    subscriptions.get(session_key(ctx), set()).discard(str(params.uri))
    await send_log(ctx, "info", f"Unsubscribed from resource: {params.uri}")
    return EmptyResult()


server._lowlevel_server.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
server._lowlevel_server.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)


# ===== Prompts =====


@server.prompt(title="Simple Test Prompt", description="A simple prompt without arguments")
def test_simple_prompt() -> str:
    return "This is a simple prompt for testing."


@server.prompt(title="Prompt With Arguments", description="A prompt with required arguments")
def test_prompt_with_arguments(
    arg1: Annotated[str, Field(description="First test argument")],
    arg2: Annotated[str, Field(description="Second test argument")],
) -> str:
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@server.prompt(title="Prompt With Embedded Resource", description="A prompt that includes an embedded resource")
def test_prompt_with_embedded_resource(
    resourceUri: Annotated[str, Field(description="URI of the resource to embed")],
) -> list[UserMessage]:
    resource = TextResourceContents(
        uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
    )
    return [
        UserMessage(EmbeddedResource(type="resource", resource=resource)),
        UserMessage("Please process the embedded resource above."),
    ]


@server.prompt(title="Prompt With Image", description="A prompt that includes image content")
def test_prompt_with_image() -> list[UserMessage]:
    return [
        UserMessage(ImageContent(type="image", data=TEST_IMAGE_BASE64, mime_type="image/png")),
        UserMessage("Please analyze the image above."),
    ]


# ===== Logging =====


async def set_level(ctx: ServerRequestContext[Any], params: SetLevelRequestParams) -> EmptyResult:
    log_levels[session_key(ctx)] = params.level
    await send_log(ctx, "info", f"Log level set to: {params.level}")
    return EmptyResult()


server._lowlevel_server.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)


# ===== Completion =====


@server.completion()
async def complete(ref: Any, argument: Any, context: Any) -> Completion:
    # Minimal, like the reference server: the capability is declared and the endpoint answers.
    return Completion(values=[], total=0, has_more=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int, help="serve on http://127.0.0.1:PORT/mcp")
    where.add_argument("--uds", help="serve on this Unix socket")
    args = ap.parse_args()

    import uvicorn

    from mcp.server.transport_security import TransportSecuritySettings

    if args.uds:
        # On a Unix socket the Host header is `localhost`, without a port.
        security = TransportSecuritySettings(allowed_hosts=["localhost"], allowed_origins=["http://localhost"])
    else:
        security = TransportSecuritySettings(
            allowed_hosts=["127.0.0.1:*", "localhost:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*"],
        )
    app = server.streamable_http_app(
        event_store=InMemoryEventStore(),
        retry_interval=1000,  # ms, sent in SSE priming events (SEP-1699)
        transport_security=security,
    )
    if args.uds:
        uvicorn.run(app, uds=args.uds, log_level="warning")
    else:
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
