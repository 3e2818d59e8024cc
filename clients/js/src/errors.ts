/** What went wrong, as a stable code an application can switch on. */
export type ViewErrorCode =
  /** 401: no token, or one the server refused; the `token` callback is asked again. */
  | 'unauthorized'
  /** 403: the token does not grant this view. */
  | 'forbidden'
  /** 400 (or another 4xx that asking again cannot change: not 401/403/404/408/429): the server
   * refuses the request itself, e.g. `keys`/`prefix` on a server that does not narrow streams.
   * Fatal: the view closes instead of retrying. */
  | 'bad_request'
  /** 404: the server has no such view (never declared, or retired since). Fatal: the view
   * closes instead of retrying; open it again once the view exists. */
  | 'not_found'
  /** The server retired the view (its runtime was deleted, or no longer declares it) and ended
   * the stream with `event: retired`. Fatal: the view closes and never reconnects; `reason` is
   * the server's. */
  | 'retired'
  /** Another HTTP status (a 503 past the server's connection limit, a proxy's error page). */
  | 'http_status'
  /** A 200 that is not `text/event-stream`: a proxy, a login page or a cache answered instead. */
  | 'bad_content_type'
  /** Headers came but no byte of the stream: something between buffers the response. */
  | 'stream_buffered'
  /** An event that must carry an `id:` came without one: something rewrote the stream. */
  | 'missing_id'
  /** An event without an `event:` type, or data that is not the server's JSON. */
  | 'bad_event'
  /** No byte (not even a heartbeat) for too long: the connection is presumed dead. */
  | 'stalled'
  /** The connection failed or was cut. */
  | 'network'
  /** Connections keep ending at once, or keep resetting: backing off harder. */
  | 'fast_retry_loop'
  /** The `token` callback threw. */
  | 'token'
  /** The cursor store could not be read or written. */
  | 'store'
  /** An application listener threw (the view carries on). */
  | 'listener';

/** An error of a view; `fatal` ones close it. */
export class ViewError extends Error {
  override readonly name = 'ViewError';

  constructor(
    readonly code: ViewErrorCode,
    message: string,
    readonly options: { status?: number; fatal?: boolean; reason?: string; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
  }

  get status(): number | undefined {
    return this.options.status;
  }

  get fatal(): boolean {
    return this.options.fatal ?? false;
  }

  /** Why the server retired the view (`retired` only), as it said. */
  get reason(): string | undefined {
    return this.options.reason;
  }
}

export type ProducerErrorCode =
  /** 403 `producer_fenced`: a producer with a newer epoch took over this id. */
  | 'fenced'
  /** 401/403 without a way to get a token that the server takes. */
  | 'unauthorized'
  /** 409 `producer_out_of_order` that renumbering cannot resolve (`expectedSeq`: the server's). */
  | 'out_of_order'
  /** 409 `producer_seq_reused`: the server committed another batch under this epoch and seq
   * (another writer with this id and epoch). Not a retry, not renumbered; `expectedSeq` is the
   * server's next seq. */
  | 'seq_reused'
  /** 409 `producer_seq_stale`: a seq so old that the server no longer keeps its receipt, so it
   * cannot say whether this batch was committed; `expectedSeq` is the server's next seq. */
  | 'seq_stale'
  /** 4xx: the server refuses this batch as it is (422 guest error, 413, 404 …). */
  | 'rejected'
  /** The producer was closed before the batch was acknowledged. */
  | 'closed'
  /** The producer store could not be read or written. */
  | 'store';

/** An error of `Producer.send`. */
export class ProducerError extends Error {
  override readonly name = 'ProducerError';

  constructor(
    readonly code: ProducerErrorCode,
    message: string,
    readonly options: { status?: number; body?: unknown; expectedSeq?: number; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
  }

  get status(): number | undefined {
    return this.options.status;
  }

  /** The seq the server expects next (`out_of_order`, `seq_reused`, `seq_stale`). */
  get expectedSeq(): number | undefined {
    return this.options.expectedSeq;
  }
}
