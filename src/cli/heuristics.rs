//! `dtr heuristics`: the policy table.

use std::process::ExitCode;

pub fn run() -> dtr::Result<ExitCode> {
    println!("{:<12} {:<22} what it does", "name", "usable in");
    for policy in dtr::policy::POLICIES {
        let usable = policy.usable.describe();
        println!("{:<12} {usable:<22} {}", policy.name, policy.about);
    }
    Ok(ExitCode::SUCCESS)
}
