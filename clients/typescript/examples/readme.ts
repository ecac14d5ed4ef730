import { readFileSync } from 'node:fs';
import { Sandbox } from '@oac/sandbox-agent-client';

const opts = JSON.parse(readFileSync(process.argv[2]!, 'utf8')); // bootstrap, forwards, flags
const sbx = await Sandbox.create({ name: 'hello', ...opts }, { signal: AbortSignal.timeout(60_000) });
const auth = 'Basic ' + Buffer.from(`${sbx.username}:${await sbx.password()}`).toString('base64');
const res = await fetch(`${sbx.url}/global/health`, { headers: { authorization: auth } });
console.log(res.status);
await sbx.stop();
