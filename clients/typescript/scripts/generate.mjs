// Generates the TypeScript types of the published schema (../../schema)
// into src/generated/, one module per schema file. Run by `npm run build`:
// the types cannot drift from the schema because they are made from it.
import { compileFromFile } from 'json-schema-to-typescript';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const schemaDir = join(here, '..', '..', '..', 'schema');
const out = join(here, '..', 'src', 'generated');
const files = {
  'event.schema.json': 'event.ts',
  'command.schema.json': 'command.ts',
  'bootstrap.schema.json': 'bootstrap.ts',
  'core-bootstrap.schema.json': 'core-bootstrap.ts',
  'policy.schema.json': 'policy.ts',
  'list.schema.json': 'list.ts',
  'running.schema.json': 'running.ts',
  'stop.schema.json': 'stop.ts',
  'check.schema.json': 'check.ts',
  'stage-progress.schema.json': 'stage-progress.ts',
};

await mkdir(out, { recursive: true });
for (const [schema, module] of Object.entries(files)) {
  const ts = await compileFromFile(join(schemaDir, schema), {
    cwd: schemaDir,
    bannerComment: `/* Generated from schema/${schema} by scripts/generate.mjs: do not edit. */`,
    additionalProperties: false,
    strictIndexSignatures: true,
    unreachableDefinitions: true,
    format: true,
    $refOptions: { resolve: { http: false } },
  });
  await writeFile(join(out, module), ts);
}

// The schema version every event carries, and the table of codes with
// whether a retry can help (schema/codes.json, written from the Go tables).
const event = JSON.parse(await readFile(join(schemaDir, 'event.schema.json'), 'utf8'));
const codes = JSON.parse(await readFile(join(schemaDir, 'codes.json'), 'utf8'));
const pkg = JSON.parse(await readFile(join(here, '..', 'package.json'), 'utf8'));
const table = (rows) => Object.fromEntries(rows.map(({ code, ...rest }) => [code, rest]));
await writeFile(
  join(out, 'codes.ts'),
  `/* Generated from schema/event.schema.json and schema/codes.json by scripts/generate.mjs: do not edit. */

/** The schema version of the events this client reads (schema_version on every line). */
export const SCHEMA_VERSION = ${JSON.stringify(event.$defs.SchemaVersion.const)} as const;

/** This client's name and version (its package.json), for the messages that say which oac-shim to install. */
export const CLIENT = ${JSON.stringify(`${pkg.name} ${pkg.version}`)};

/** Every failure code of a failed sandbox: oac-shim's exit status, whether the same request may succeed later, what to do. */
export const FAILURES = ${JSON.stringify(table(codes.failures), null, 2)} as const;

/** Every answer code of a refused command: whether the same command may succeed later, and when it is given. */
export const ANSWERS = ${JSON.stringify(table(codes.answers), null, 2)} as const;

/** Every code of a failed staging (oac-image stage): whether staging again may succeed, and what it means. */
export const STAGE = ${JSON.stringify(table(codes.stage), null, 2)} as const;
`,
);
