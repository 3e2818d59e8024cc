//! Init images: what a guest's `init(config)` leaves in a fresh instance, kept so that the next
//! instance of the same module with the same config starts from it instead of running `init`
//! again.
//!
//! Every batch runs on a new instance (see `runtime::guest`), and the JavaScript engine's `init`
//! — a realm made, the user's module compiled and evaluated — is most of what an instance costs.
//! `init` is deterministic (no clock, no chance: the same module and config give the same
//! memory), so its result is the same every time, and written over a fresh instance's memory it
//! gives the instance `init` would have made, byte for byte. What it keeps is the linear memory
//! only: a guest compiled from Rust or C keeps its data there, and the one mutable global such a
//! module has, its stack pointer, is back where it started when `init` returns.
//!
//! Only the pages `init` changed are kept. The images are held by the engine, the least
//! recently used dropped past [`IMAGE_BYTES`]: an idle runtime's image goes, and its next
//! instance runs `init` again.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use wasmtime::{Memory, Store};

use super::{GuestError, ModuleFingerprint};

/// Bytes of page a dirty page is kept by.
const PAGE: usize = 4096;

/// Bytes of images an engine keeps at most.
pub(crate) const IMAGE_BYTES: usize = 64 << 20;

/// What `init` left in an instance of one module with one config.
#[derive(Debug)]
pub(crate) struct InitImage {
    fingerprint: ModuleFingerprint,
    config: Bytes,
    /// The memory's size after `init`, in bytes.
    memory_bytes: usize,
    /// The pages that differ from a fresh instance's, by offset.
    pages: Vec<(usize, Box<[u8]>)>,
    /// The input buffer the guest allocated for the config: its address and capacity.
    pub(crate) input_buf: (usize, usize),
    /// What `init` replied: the guest's declaration.
    pub(crate) declaration: Option<Bytes>,
}

impl InitImage {
    /// The image of `memory` after `init`, against `fresh`, a copy of it taken before anything
    /// ran in the instance.
    pub(crate) fn capture<T>(
        key: (ModuleFingerprint, Bytes),
        store: &Store<T>,
        memory: Memory,
        fresh: &[u8],
        input_buf: (usize, usize),
        declaration: Option<Bytes>,
    ) -> Self {
        let now = memory.data(store);
        let pages = now
            .chunks(PAGE)
            .enumerate()
            .filter_map(|(i, page)| {
                let offset = i * PAGE;
                let before = fresh.get(offset..(offset + page.len()).min(fresh.len()));
                let unchanged = match before {
                    Some(before) if before.len() == page.len() => before == page,
                    // Grown by `init`: a fresh page is zeros.
                    _ => page.iter().all(|&b| b == 0),
                };
                (!unchanged).then(|| (offset, Box::from(page)))
            })
            .collect();
        let (fingerprint, config) = key;
        Self {
            fingerprint,
            config,
            memory_bytes: now.len(),
            pages,
            input_buf,
            declaration,
        }
    }

    /// Makes a fresh instance's `memory` what `init` left.
    ///
    /// # Errors
    /// [`GuestError::MemoryExceeded`]-like failures of growing the memory, as
    /// [`GuestError::Instantiate`].
    pub(crate) fn apply<T>(&self, store: &mut Store<T>, memory: Memory) -> Result<(), GuestError> {
        let have = memory.data_size(&*store);
        if self.memory_bytes > have {
            let pages = ((self.memory_bytes - have) as u64).div_ceil(65536);
            memory
                .grow(&mut *store, pages)
                .map_err(|e| GuestError::Instantiate(e.into_boxed_dyn_error()))?;
        }
        let data = memory.data_mut(store);
        for (offset, page) in &self.pages {
            data[*offset..*offset + page.len()].copy_from_slice(page);
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.pages.len() * PAGE + self.config.len()
    }

    fn is(&self, fingerprint: &ModuleFingerprint, config: &[u8]) -> bool {
        self.fingerprint == *fingerprint && self.config == config
    }
}

/// The images an engine keeps, the most recently used last.
#[derive(Debug, Default)]
pub(crate) struct Images {
    kept: VecDeque<Arc<InitImage>>,
    bytes: usize,
}

impl Images {
    /// The image of `fingerprint` with `config`, if kept.
    pub(crate) fn get(
        &mut self,
        fingerprint: &ModuleFingerprint,
        config: &[u8],
    ) -> Option<Arc<InitImage>> {
        let at = self.kept.iter().position(|i| i.is(fingerprint, config))?;
        let image = self.kept.remove(at)?;
        self.kept.push_back(Arc::clone(&image));
        Some(image)
    }

    /// Keeps `image`, dropping the least recently used past [`IMAGE_BYTES`].
    pub(crate) fn keep(&mut self, image: Arc<InitImage>) {
        if self
            .kept
            .iter()
            .any(|i| i.is(&image.fingerprint, &image.config))
        {
            return;
        }
        self.bytes += image.bytes();
        self.kept.push_back(image);
        while self.bytes > IMAGE_BYTES {
            match self.kept.pop_front() {
                Some(dropped) => self.bytes -= dropped.bytes(),
                None => break,
            }
        }
    }
}
