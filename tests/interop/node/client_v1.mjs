// The TypeScript MCP SDK 1.x (@modelcontextprotocol/sdk) as a client of carapace's MCP front.
//
//     node client_v1.mjs --url http://127.0.0.1:PORT/mcp
//
// The 1.x SDK speaks the handshake era only (initialize, then Mcp-Session-Id). Lists the tools,
// makes a good call (to memory.append, or --tool with --good and --bad), a call with bad arguments and a call to an unknown tool,
// ends the session with DELETE, and prints one JSON object with what it saw. Exits 1 when the
// SDK reports anything unexpected (carapace's tests/mcp_node.rs checks the details).
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { arg, callArgs, summarize, texts, unknownTool } from './common.mjs';

const url = arg('--url');
const call = callArgs('from node v1');

const client = new Client({ name: 'carapace-interop-v1', version: '1.0.0' });
const transport = new StreamableHTTPClientTransport(new URL(url));
await client.connect(transport, { timeout: 20000 });

const seen = { sdk: '@modelcontextprotocol/sdk', mode: 'legacy' };
seen.protocol_version = transport.protocolVersion ?? null;
seen.server = client.getServerVersion() ?? null;
seen.session_id = transport.sessionId ?? null;
const tools = await client.listTools();
seen.tools = tools.tools.map((t) => t.name).sort();
const good = await client.callTool({ name: call.tool, arguments: call.good });
seen.good = { is_error: !!good.isError, structured: good.structuredContent ?? null, text: texts(good) };
const bad = await client.callTool({ name: call.tool, arguments: call.bad });
seen.bad = { is_error: !!bad.isError, text: texts(bad) };
seen.unknown = await unknownTool(() => client.callTool({ name: 'memory.nope', arguments: {} }));
await transport.terminateSession();
seen.session_ended = transport.sessionId === undefined;
await client.close();

process.exit(summarize(seen, call.tool));
