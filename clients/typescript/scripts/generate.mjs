// Generates the TypeScript types of the published schema (../../schema)
// into src/generated/, one module per schema file. Run by `npm run build`:
// the types cannot drift from the schema because they are made from it.
import { compileFromFile } from 'json-schema-to-typescript';
import { mkdir, writeFile } from 'node:fs/promises';
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
