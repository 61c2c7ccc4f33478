//! One module per subcommand.

pub mod bench;
pub mod demo;
pub mod generate;
pub mod info;
pub mod model;
