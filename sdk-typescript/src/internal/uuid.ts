// UUIDv7 ids for activities submitted without one. The client fills them in
// before the first try, as the Rust client does, so a submit retried after a
// lost answer names the same key and stays idempotent; v7 (time first) like the
// server's own, so generated ids sort by submit time.
import { randomBytes } from "node:crypto";

export function uuidv7(now: number = Date.now()): string {
  const bytes = randomBytes(16);
  // 48 bits of Unix milliseconds, big-endian.
  let ms = now;
  for (let i = 5; i >= 0; i--) {
    bytes[i] = ms % 256;
    ms = Math.floor(ms / 256);
  }
  bytes[6] = (bytes[6]! & 0x0f) | 0x70; // version 7
  bytes[8] = (bytes[8]! & 0x3f) | 0x80; // RFC 4122 variant
  const hex = bytes.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
