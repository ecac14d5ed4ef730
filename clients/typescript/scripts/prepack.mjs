// Run by `npm pack` and `npm publish` (prepack): copies the project's
// LICENSE and NOTICE into the package and checks that package.json's
// oac.schemaVersion is the schema version of schema/ (the version of the
// events this client reads), so a published package says what it speaks.
import { copyFile, readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = join(dirname(fileURLToPath(import.meta.url)), '..');
const root = join(here, '..', '..');
await copyFile(join(root, 'LICENSE'), join(here, 'LICENSE'));
await copyFile(join(root, 'NOTICE'), join(here, 'NOTICE'));
const pkg = JSON.parse(await readFile(join(here, 'package.json'), 'utf8'));
const event = JSON.parse(await readFile(join(root, 'schema', 'event.schema.json'), 'utf8'));
const want = event.$defs.SchemaVersion.const;
if (pkg.oac?.schemaVersion !== want) {
  console.error(`prepack: package.json oac.schemaVersion is ${pkg.oac?.schemaVersion}, schema/ is version ${want}: set it to ${want}`);
  process.exit(1);
}
