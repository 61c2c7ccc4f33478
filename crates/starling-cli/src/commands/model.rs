//! `starling model fetch|list`.

use anyhow::Result;
use clap::{Args, Subcommand};
use starling_hub::{fetch, list_models, FetchOptions};

/// `starling model ...`
#[derive(Args, Debug)]
pub struct ModelArgs {
    #[command(subcommand)]
    command: ModelCommand,
}

#[derive(Subcommand, Debug)]
enum ModelCommand {
    /// Download a known model into the cache ($STARLING_HOME, default ~/.cache/starling),
    /// verifying its sha256. Does nothing if it is already there.
    Fetch {
        /// The model alias (see `starling model list`).
        alias: String,
    },
    /// List the known models and whether they are cached.
    List,
}

/// Runs `starling model ...`.
pub fn run(args: ModelArgs) -> Result<()> {
    let options = FetchOptions::from_env()?;
    match args.command {
        ModelCommand::Fetch { alias } => {
            let path = fetch(&alias, &options)?;
            println!("{}", path.display());
        }
        ModelCommand::List => {
            println!(
                "{:<22} {:>12}  {:<8} description",
                "alias", "size", "cached"
            );
            for entry in list_models(&options.home) {
                println!(
                    "{:<22} {:>12}  {:<8} {}",
                    entry.alias,
                    starling_kv::format_bytes(entry.size_bytes),
                    if entry.cached_path.is_some() {
                        "yes"
                    } else {
                        "no"
                    },
                    entry.description
                );
            }
        }
    }
    Ok(())
}
