//! The tools: the engine over files and fleets. `replay`, `backtest` and `eval` read
//! recorded sessions (`driver` runs the engine over a file on every core, in one
//! thread's order); `simulate` makes fleets and `feed` sends them somewhere; `demo` shows
//! a loop stopped; `fuzz` holds the fuzzers' entry points.
//!
//! Guarantees: the same input gives the same bytes out, on any number of threads.

pub mod backtest;
pub mod demo;
pub mod driver;
pub mod eval;
pub mod feed;
#[doc(hidden)]
pub mod fuzz;
pub mod replay;
pub mod simulate;
