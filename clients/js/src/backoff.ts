/**
 * Full-jitter exponential backoff: the n-th delay in a row is uniform in
 * `[0, min(max, base * 2^n)]`, never below a server's `Retry-After`.
 */
export class Backoff {
  private failures = 0;

  constructor(
    private readonly base: number,
    private readonly max: number,
    private readonly random: () => number = Math.random,
  ) {}

  /** Failures in a row so far. */
  get attempts(): number {
    return this.failures;
  }

  /** The delay before the next attempt, in ms; counts one more failure. */
  next(floor = 0, equalJitter = false): number {
    const ceiling = Math.min(this.max, this.base * 2 ** Math.min(this.failures, 30));
    this.failures += 1;
    const jittered = equalJitter ? ceiling / 2 + (this.random() * ceiling) / 2 : this.random() * ceiling;
    return Math.max(floor, jittered);
  }

  reset(): void {
    this.failures = 0;
  }
}

/** `Retry-After` in ms (delta-seconds or an HTTP date), or 0. */
export function retryAfterMs(value: string | null, now = Date.now()): number {
  if (!value) return 0;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const date = Date.parse(value);
  return Number.isFinite(date) ? Math.max(0, date - now) : 0;
}

/** A sleep that `wake()` or `cancel()` ends early. */
export class Sleep {
  private timer: ReturnType<typeof setTimeout> | undefined;
  private resolve: (() => void) | undefined;

  wait(ms: number): Promise<void> {
    this.wake();
    return new Promise(resolve => {
      this.resolve = resolve;
      this.timer = setTimeout(() => this.wake(), ms);
    });
  }

  wake(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    const resolve = this.resolve;
    this.resolve = undefined;
    resolve?.();
  }
}
