/** A cursor `<16 hex digits: epoch>-<offset>`, as the server writes it in `id:` lines. */
export interface ParsedCursor {
  readonly epoch: string;
  readonly offset: number;
}

const CURSOR = /^([0-9a-f]{16})-(\d{1,16})$/;

/** The parts of a cursor, or `undefined` when `id` is not one. */
export function parseCursor(id: string | undefined): ParsedCursor | undefined {
  const m = CURSOR.exec(id ?? '');
  if (!m) return undefined;
  return { epoch: m[1]!, offset: Number(m[2]) };
}

/** Whether the event `id` is at or before `cursor` in the same epoch (already applied). */
export function atOrBefore(id: ParsedCursor, cursor: ParsedCursor | undefined): boolean {
  return cursor !== undefined && id.epoch === cursor.epoch && id.offset <= cursor.offset;
}
