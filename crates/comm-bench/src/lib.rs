//! comm-bench: the collective benchmark and profiler of nccl-workshop. It times collectives on
//! any backend the way nccl-tests does (size, count, time, algbw, busbw, #wrong), writes CSV and
//! JSON, and `comm-bench report` turns result files into plots, tables and observations.
//!
//! - [`cli`]: the flags (nccl-tests' where they fit) and the presets of the course's runs
//! - [`plan`]: flags → the sweep to run
//! - [`measure`]: one collective at one size, timed and checked
//! - [`groups`]: `--group-size`, the collectives on sub-communicators, every group at once
//! - [`budget`]: which sizes fit in host and GPU memory, and the note for those that do not
//! - [`driver`]: the parent that starts ranks per world size, and the ranks themselves
//! - [`table`], [`record`]: nccl-tests' table; rows for CSV/JSON
//! - [`report`]: plots (plotters, PNG and SVG), markdown and observations
//! - [`model`]: the models: the α–β fit (`comm-bench model`, the report's dashed curves) and
//!   NCCL's cost model
//! - [`predict`]: NCCL's cost model for a described cluster (`comm-bench predict`)
//! - [`course`]: the course's own outputs of `--preset profiler` and `--preset allreduce-sweep`
//! - [`store_load`]: N ranks' rendezvous against our store and PyTorch's (`comm-bench store-load`)
//! - [`error`]: what can go wrong, one variant per cause

pub mod budget;
pub mod cli;
pub mod course;
pub mod driver;
pub mod error;
pub mod grids;
pub mod groups;
pub mod measure;
pub mod model;
pub mod plan;
pub mod predict;
pub mod record;
pub mod report;
pub mod store_load;
pub mod table;
pub mod timeline;
pub mod units;
