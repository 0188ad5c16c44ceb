//! `reactor list`: each reactor's time split and sleeps (`framework_get_reactors`).

use std::path::Path;

use clap::Subcommand;
use serde_json::Value;

use super::session::{cell, out, print_json, seconds, table, u64_field, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum ReactorCommand {
    /// Per-reactor time split, sleep counts, pollers and parked pollers
    List,
}

pub(crate) fn run(rpc: &Path, json: bool, command: ReactorCommand) -> Result<(), CliError> {
    match command {
        ReactorCommand::List => reactor_list(rpc, json),
    }
}

fn reactor_list(rpc: &Path, json: bool) -> Result<(), CliError> {
    let r = Session::connect(rpc, &[])?.call("framework_get_reactors", None)?;
    if json {
        print_json(&r);
        return Ok(());
    }
    let Some(list) = r.get("reactors").and_then(Value::as_array) else {
        return Err(CliError::Unexpected { method: "framework_get_reactors", result: r });
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|x| {
            let busy = u64_field(x, "busy");
            let idle = u64_field(x, "idle");
            let pct = if busy + idle == 0 { 0.0 } else { 100.0 * busy as f64 / (busy + idle) as f64 };
            let state = if x["in_interrupt"].as_bool() == Some(true) { "sleeping" } else { "polling" };
            vec![
                cell(x, "lcore"),
                state.to_string(),
                format!("{pct:.1}"),
                seconds(busy),
                seconds(u64_field(x, "poll_idle_ns")),
                seconds(u64_field(x, "sleep_ns")),
                cell(x, "sleeps"),
                cell(x, "rounds"),
                cell(x, "pollers"),
                cell(x, "pollers_parked"),
            ]
        })
        .collect();
    let head = ["CORE", "STATE", "BUSY%", "BUSY", "IDLE", "ASLEEP", "SLEEPS", "ROUNDS", "POLLERS", "PARKED"];
    out(&table(&head, &rows));
    Ok(())
}
