//! Procedural macros for outbox (skeleton).
