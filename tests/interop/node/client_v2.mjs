// The TypeScript MCP client 2.x (@modelcontextprotocol/client) as a client of carapace's MCP
// front.
//
//     node client_v2.mjs --url http://127.0.0.1:PORT/mcp --mode 2026-07-28|auto|legacy
//
// `2026-07-28` pins the stateless era, `auto` probes with server/discover and `legacy` runs the
// initialize handshake. Lists the tools, makes a good call (to memory.append, or --tool with --good and --bad), a call with bad
// arguments and a call to an unknown tool, and prints one JSON object with what it saw. Exits 1
// when the client reports anything unexpected (carapace's tests/mcp_node.rs checks the details).
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { arg, callArgs, summarize, texts, unknownTool } from './common.mjs';

const url = arg('--url');
const mode = arg('--mode', 'auto');
const call = callArgs(`from node v2 (${mode})`);
const negotiation = mode === 'auto' || mode === 'legacy' ? { mode } : { mode: { pin: mode } };

const client = new Client(
  { name: 'carapace-interop-v2', version: '1.0.0' },
  { versionNegotiation: negotiation },
);
const transport = new StreamableHTTPClientTransport(new URL(url));
await client.connect(transport, { timeout: 20000 });

const seen = { sdk: '@modelcontextprotocol/client', mode };
seen.protocol_version = client.getNegotiatedProtocolVersion() ?? null;
seen.era = client.getProtocolEra() ?? null;
seen.session_id = transport.sessionId ?? null;
const tools = await client.listTools();
seen.tools = tools.tools.map((t) => t.name).sort();
const good = await client.callTool({ name: call.tool, arguments: call.good });
seen.good = { is_error: !!good.isError, structured: good.structuredContent ?? null, text: texts(good) };
const bad = await client.callTool({ name: call.tool, arguments: call.bad });
seen.bad = { is_error: !!bad.isError, text: texts(bad) };
seen.unknown = await unknownTool(() => client.callTool({ name: 'memory.nope', arguments: {} }));
await client.close();

process.exit(summarize(seen, call.tool));
