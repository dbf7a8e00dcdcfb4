//! kafka adapter: see the module docs of `brokers`.
