// Helpers shared by the client scripts.

/** The value after `name` on the command line, or `fallback`. */
export function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  if (i >= 0 && i + 1 < process.argv.length) return process.argv[i + 1];
  if (fallback === undefined) {
    console.error(`${name} is required`);
    process.exit(2);
  }
  return fallback;
}

/** The text blocks of a CallToolResult. */
export function texts(result) {
  return (result.content ?? []).filter((c) => c.type === 'text').map((c) => c.text);
}

/** Call an unknown tool: a JSON-RPC error surfaces as a thrown error with its code. */
export async function unknownTool(call) {
  try {
    const r = await call();
    return { is_error: !!r.isError, text: texts(r) };
  } catch (e) {
    return { raised: e?.constructor?.name ?? 'Error', code: e?.code ?? null, message: String(e?.message ?? e) };
  }
}

/**
 * The tool to call and its good and bad arguments: `--tool NAME --good JSON --bad JSON`, by
 * default the memory app's `memory.append` with `good` as its text.
 */
export function callArgs(good) {
  return {
    tool: arg('--tool', 'memory.append'),
    good: JSON.parse(arg('--good', JSON.stringify({ text: good }))),
    bad: JSON.parse(arg('--bad', JSON.stringify({ text: 5 }))),
  };
}

/** Print what was seen as one JSON line; the exit status: 0 when it is what a user expects. */
export function summarize(seen, tool = 'memory.append') {
  console.log(JSON.stringify(seen));
  const ok =
    seen.tools.includes(tool) &&
    !seen.good.is_error &&
    seen.bad.is_error &&
    String(seen.bad.text[0] ?? '').startsWith('INVALID_ARGS') &&
    seen.unknown.code === -32602;
  return ok ? 0 : 1;
}
