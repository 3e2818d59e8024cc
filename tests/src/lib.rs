//! End-to-end test support for viewtape.
