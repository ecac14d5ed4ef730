// A bounded history of events: the last `size` of them, numbered in the
// order they arrived, and a wake-up for those waiting for the next one.

/** How many events a sandbox keeps by default (the historySize option changes it). */
export const DEFAULT_HISTORY_SIZE = 1024;

export class Ring<T> {
  private readonly buf: T[] = [];
  /** The number of the oldest kept item (items are numbered from 0). */
  private first = 0;
  private wake: () => void = () => {};
  private woken: Promise<void>;

  constructor(readonly size: number) {
    if (!Number.isInteger(size) || size < 1) throw new RangeError(`history size ${size}: want a whole number of events, at least 1`);
    this.woken = new Promise((r) => (this.wake = r));
  }

  /** The number the next item will have. */
  get next(): number {
    return this.first + this.buf.length;
  }

  /** The number of the oldest item kept. */
  get oldest(): number {
    return this.first;
  }

  push(v: T): void {
    this.buf.push(v);
    if (this.buf.length > this.size) {
      this.buf.shift();
      this.first++;
    }
    this.notify();
  }

  /** Item n, or undefined when it is not kept (gone, or not yet there). */
  at(n: number): T | undefined {
    return n < this.first ? undefined : this.buf[n - this.first];
  }

  /** The kept items, oldest first. */
  items(): readonly T[] {
    return this.buf;
  }

  /** Resolves at the next push or notify. */
  changed(): Promise<void> {
    return this.woken;
  }

  /** Wakes every waiter (the end of the stream, a password, ...). */
  notify(): void {
    const wake = this.wake;
    this.woken = new Promise((r) => (this.wake = r));
    wake();
  }
}
