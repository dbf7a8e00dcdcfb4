//! nats adapter: see the module docs of `brokers`.
