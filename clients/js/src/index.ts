/**
 * `@viewtape/client`: a view as a live keyed map ({@link openView}), a runtime as an idempotent
 * producer ({@link openProducer}). Node-only helpers (a file store) are in `@viewtape/client/node`,
 * the React hook in `@viewtape/client/react`.
 */
export { openView, View } from './view.js';
export type { Change, ChangeInfo, ResetInfo, Status, TokenSource, ViewEvents, ViewOptions } from './view.js';
export { openProducer, Producer } from './producer.js';
export type { Batch, ProducerOptions, Receipt } from './producer.js';
export { ProducerError, ViewError } from './errors.js';
export type { ProducerErrorCode, ViewErrorCode } from './errors.js';
export { indexedDbStore, localStorageStore, memoryStore } from './store.js';
export type { CursorStore, ProducerStore, SavedProducer, SavedView, Store } from './store.js';
export { parseCursor } from './cursor.js';
export type { ParsedCursor } from './cursor.js';
