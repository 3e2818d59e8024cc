// Type-checked against the packed tarball in a fresh project (scripts/check-client-packages).
import { openProducer, openView, ViewError, type Change } from '@viewtape/client';
import { fileStore } from '@viewtape/client/node';
import { useView } from '@viewtape/client/react';
import { typesFor, viewSchema, ViewTypesError } from '@viewtape/client/types';

/** What `npx viewtape-types URL prices` writes, by hand here. */
interface Tick {
  symbol: string;
  price: number;
}

export async function follow(baseUrl: string): Promise<void> {
  const view = openView(baseUrl, 'prices', {
    token: async () => 'a fresh token from your login endpoint',
    cursorStore: fileStore('./.viewtape'),
  });
  const off = view.on('change', ({ key, value, deleted }: Change) => {
    console.log(deleted ? `${key} deleted` : `${key} = ${JSON.stringify(value)}`);
  });
  view.on('error', (error: ViewError) => console.warn(error.code, error.message));
  await view.synced();
  const rows: ReadonlyMap<string, unknown> = view.state;
  console.log(rows.size, view.cursor, view.status);
  off();
  await view.close();

  const producer = openProducer(baseUrl, 'demo', { id: 'ticker-1', store: fileStore('./.viewtape') });
  const receipt = await producer.send(['{"symbol":"ACME","price":12.5,"seq":1}']);
  console.log(receipt.seq, receipt.duplicate, receipt.events);
}

export function usePrices(): number {
  const { state, status, cursor, error } = useView('prices', { baseUrl: 'http://localhost:8080' });
  if (error) console.warn(error.code);
  return status === 'live' && cursor !== undefined ? state.size : 0;
}

export async function typed(baseUrl: string): Promise<string> {
  const view = openView<Tick>(baseUrl, 'prices');
  view.on('change', change => {
    if (!change.deleted) console.log(change.key, change.value.price.toFixed(2));
  });
  const tick: Tick | undefined = view.state.get('ACME');
  console.log(tick?.symbol);
  await view.close();
  try {
    return await typesFor(await viewSchema(baseUrl, 'prices', { token: 'a token' }), 'Tick');
  } catch (error) {
    if (error instanceof ViewTypesError && error.code === 'no_schema') return 'export type Tick = unknown;';
    throw error;
  }
}

export function useTicks(): number {
  const { state } = useView<Tick>('prices', { baseUrl: 'http://localhost:8080' });
  return [...state.values()].reduce((sum, tick) => sum + tick.price, 0);
}
