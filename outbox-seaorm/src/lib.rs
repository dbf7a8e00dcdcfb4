//! seaorm
