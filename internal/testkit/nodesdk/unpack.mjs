// The install step of the Node VM workers in the tests and benchmarks
// (written into the worker's directory by internal/testkit/nodesdk): it
// lays the vendored Node SDK (vendor.pack.gz, written by nodesdk.WritePack)
// out as node_modules, as `npm ci` would from a registry. The pack is gzip
// of records: u32 path length, path, u32 mode, u32 size, bytes (big endian).
import { readFileSync, writeFileSync, mkdirSync, chmodSync } from "node:fs";
import { dirname, join } from "node:path";
import { gunzipSync } from "node:zlib";

const buf = gunzipSync(readFileSync("vendor.pack.gz"));
let off = 0;
let files = 0;
while (off < buf.length) {
  const n = buf.readUInt32BE(off); off += 4;
  const rel = buf.subarray(off, off + n).toString("utf8"); off += n;
  const mode = buf.readUInt32BE(off); off += 4;
  const size = buf.readUInt32BE(off); off += 4;
  if (rel.startsWith("/") || rel.split("/").includes("..")) throw new Error(`bad path ${rel}`);
  const dst = join("node_modules", rel);
  mkdirSync(dirname(dst), { recursive: true });
  writeFileSync(dst, buf.subarray(off, off + size));
  chmodSync(dst, mode & 0o777);
  off += size;
  files++;
}
console.log(`unpacked ${files} files into node_modules`);
