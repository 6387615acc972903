// Parse an AsyncAPI document with the official parser (@asyncapi/parser) and print its
// diagnostics, one JSON object per line: {"severity": "error"|"warning"|..., "code", "message",
// "path"}. Exit 0 when there is no error, 1 when there is one, 2 when the parser is missing.
//
//   node validate.cjs PARSER_DIR DOCUMENT
//
// PARSER_DIR is where `npm install --prefix PARSER_DIR @asyncapi/parser` put it (./run test
// installs it in .cache/asyncapi).
"use strict";
const fs = require("fs");
const path = require("path");

const [parserDir, documentPath] = process.argv.slice(2);
let Parser;
try {
  ({ Parser } = require(path.resolve(parserDir, "node_modules", "@asyncapi", "parser")));
} catch (err) {
  console.error(`@asyncapi/parser not found under ${parserDir}: ${err.message}`);
  process.exit(2);
}
const SEVERITIES = ["error", "warning", "info", "hint"];

(async () => {
  const text = fs.readFileSync(documentPath, "utf8");
  const { document, diagnostics } = await new Parser().parse(text);
  let errors = 0;
  for (const d of diagnostics) {
    const severity = SEVERITIES[d.severity] || String(d.severity);
    if (d.severity === 0) errors += 1;
    console.log(JSON.stringify({ severity, code: d.code, message: d.message, path: d.path }));
  }
  process.exit(errors || document === undefined ? 1 : 0);
})().catch((err) => {
  console.error(`the parser failed: ${err.stack || err}`);
  process.exit(1);
});
