//! The integration tests of the putex crate: one binary, shared helpers.

mod agent_e2e;
mod agent_faults;
mod agent_http;
mod agent_lib;
mod cli_docs;
mod cli_env;
mod common;
mod demo;
mod failsafe;
mod fuzz;
mod gateway;
mod history;
mod id_pool;
mod lease;
mod lock;
mod operator;
mod packaging;
mod postgres;
mod serve;
mod serve_kv;
mod store_auth;
mod store_contract;
mod supervision;
mod web;
