//! Tenant cells: the directory of which PostgreSQL cluster holds which tenant.
//!
//! A deployment outgrows one primary by splitting its tenants across cells: each cell is a
//! cluster of its own (a primary, its standbys) with its own log, read models and workers, and
//! each tenant lives in exactly one. The directory is a file (`serve --cells cells.json`), not a
//! control database: it changes only when a cell is added or a tenant moves, both operations an
//! operator does with the tenant paused, and a file adds no database that every request, and
//! every cell's availability, would depend on. Every process of a deployment reads the same file.
//!
//! ```json
//! {
//!   "cells": {
//!     "eu1": { "number": 1, "database_url": "postgres://…/asiento", "read_database_urls": [] },
//!     "eu2": { "number": 2, "database_url": "postgres://…/asiento" }
//!   },
//!   "home": "eu1",
//!   "tenants": { "acme": "eu1", "globex": "eu2" }
//! }
//! ```
//!
//! A cell's number goes into every payment id minted there (`asiento_domain::cell`), which is how
//! a provider's webhook finds its cell. `home` (the lowest number if unset) holds the payments
//! minted before the deployment had cells, and answers what names no tenant. `front` routes
//! requests.

pub mod front;
pub mod move_tenant;
pub mod verify;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use asiento_domain::{CellNumber, TenantId};
use serde::Deserialize;

/// One cell as the directory file writes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellEntry {
    /// Stamped into the ids of the payments created in the cell: never reused for another cell.
    pub number: u64,
    /// The cell's primary (several hosts with `target_session_attrs=read-write` for failover).
    pub database_url: String,
    /// The cell's standbys that serve its reads.
    #[serde(default)]
    pub read_database_urls: Vec<String>,
    /// Tenants moved to another cell whose copy stays behind in this cell's log (the log keeps
    /// every event): frozen, read by nobody, and not a misplaced tenant to `verify`.
    #[serde(default)]
    pub moved_out: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DirectoryFile {
    cells: BTreeMap<String, CellEntry>,
    #[serde(default)]
    home: Option<String>,
    tenants: BTreeMap<String, String>,
    #[serde(default)]
    paused: Vec<String>,
}

/// A cell of the directory, checked.
#[derive(Debug, Clone)]
pub struct Cell {
    pub name: String,
    pub number: CellNumber,
    pub database_url: String,
    pub read_database_urls: Vec<String>,
    pub moved_out: Vec<String>,
}

/// The directory, checked: names and numbers unique, every tenant in a cell that exists.
#[derive(Debug, Clone)]
pub struct Directory {
    cells: Vec<Cell>,
    home: usize,
    tenants: BTreeMap<TenantId, usize>,
    /// Tenants whose requests and provider events are refused for now (503, retried): a tenant
    /// being moved.
    paused: Vec<TenantId>,
}

impl Directory {
    pub fn load(path: &Path) -> anyhow::Result<Directory> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the cells directory {}", path.display()))?;
        Directory::parse(&text).with_context(|| format!("the cells directory {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Directory> {
        let file: DirectoryFile = serde_json::from_str(text)?;
        anyhow::ensure!(!file.cells.is_empty(), "no cell is listed");
        let mut cells: Vec<Cell> = Vec::with_capacity(file.cells.len());
        for (name, entry) in file.cells {
            TenantId::parse(&name).with_context(|| format!("cell name {name:?}"))?;
            let number = CellNumber::new(entry.number).with_context(|| format!("cell {name}"))?;
            if let Some(other) = cells.iter().find(|cell| cell.number == number) {
                anyhow::bail!(
                    "cells {} and {name} have the same number {number}",
                    other.name
                );
            }
            cells.push(Cell {
                name,
                number,
                database_url: entry.database_url,
                read_database_urls: entry.read_database_urls,
                moved_out: entry.moved_out,
            });
        }
        cells.sort_by_key(|cell| cell.number);
        let index_of = |name: &str| cells.iter().position(|cell| cell.name == name);
        let home = match &file.home {
            Some(name) => index_of(name).with_context(|| format!("home {name:?} is no cell"))?,
            None => 0,
        };
        let mut tenants = BTreeMap::new();
        for (tenant, cell) in &file.tenants {
            let tenant = TenantId::parse(tenant)?;
            let index = index_of(cell)
                .with_context(|| format!("tenant {tenant} is in {cell:?}, which is no cell"))?;
            tenants.insert(tenant, index);
        }
        let mut paused = Vec::with_capacity(file.paused.len());
        for tenant in &file.paused {
            let tenant = TenantId::parse(tenant)?;
            anyhow::ensure!(
                tenants.contains_key(&tenant),
                "paused tenant {tenant} is in no cell"
            );
            paused.push(tenant);
        }
        for cell in &cells {
            for tenant in &cell.moved_out {
                let tenant = TenantId::parse(tenant)?;
                anyhow::ensure!(
                    tenants
                        .get(&tenant)
                        .is_some_and(|&index| cells[index].name != cell.name),
                    "tenant {tenant} moved out of cell {} is not placed in another cell",
                    cell.name
                );
            }
        }
        Ok(Directory {
            cells,
            home,
            tenants,
            paused,
        })
    }

    /// Every cell, by number.
    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    /// The cell of a tenant the directory places.
    pub fn cell_of_tenant(&self, tenant: &TenantId) -> Option<&Cell> {
        self.tenants.get(tenant).map(|&index| &self.cells[index])
    }

    pub fn is_paused(&self, tenant: &TenantId) -> bool {
        self.paused.contains(tenant)
    }

    /// Whether a payment found in `cell` by its id may belong to a tenant that is not served
    /// there as usual (moved out of it, or paused): then its tenant must be looked up.
    pub fn has_exceptions(&self, cell: &Cell) -> bool {
        !cell.moved_out.is_empty()
            || self.paused.iter().any(|tenant| {
                self.cell_of_tenant(tenant)
                    .is_some_and(|c| c.name == cell.name)
            })
    }

    /// The cell with this number.
    pub fn cell_numbered(&self, number: CellNumber) -> Option<&Cell> {
        self.cells.iter().find(|cell| cell.number == number)
    }

    /// The cell of ids minted without a cell, and of what names no tenant.
    pub fn home(&self) -> &Cell {
        &self.cells[self.home]
    }

    /// The cells named, in directory order; every cell when `names` is empty.
    pub fn select(&self, names: &[String]) -> anyhow::Result<Vec<Cell>> {
        if names.is_empty() {
            return Ok(self.cells.clone());
        }
        for name in names {
            anyhow::ensure!(
                self.cells.iter().any(|cell| &cell.name == name),
                "--cell {name:?} is not in the cells directory"
            );
        }
        Ok(self
            .cells
            .iter()
            .filter(|cell| names.contains(&cell.name))
            .cloned()
            .collect())
    }
}

/// `asiento cells …`: operations on the cells of a directory.
#[derive(clap::Subcommand, Debug)]
pub enum CellsCommand {
    /// Copy a paused tenant to another cell (PostgreSQL), then clear its state in the old one.
    Move(move_tenant::MoveArgs),
}

pub async fn run(command: CellsCommand) -> anyhow::Result<()> {
    match command {
        CellsCommand::Move(args) => move_tenant::run(args).await,
    }
}

/// `--cells` and `--cell` for the commands that work per cell (`verify`, `projections status`,
/// `reconcile`): each selected cell's database in turn instead of `--database-url`.
#[derive(clap::Args, Debug, Clone)]
pub struct CellsArgs {
    /// The cells directory (JSON): run on the database of each of its cells.
    #[arg(long = "cells", env = "ASIENTO_CELLS")]
    pub directory: Option<std::path::PathBuf>,
    /// Only these cells of the directory (comma-separated names).
    #[arg(
        long = "cell",
        env = "ASIENTO_CELL",
        value_delimiter = ',',
        requires = "directory"
    )]
    pub names: Vec<String>,
}

impl CellsArgs {
    /// The directory and the cells to run on, or `None` without `--cells`.
    pub fn selected(&self) -> anyhow::Result<Option<Selected>> {
        let Some(path) = &self.directory else {
            return Ok(None);
        };
        let directory = Directory::load(path)?;
        let cells = directory.select(&self.names)?;
        Ok(Some(Selected { directory, cells }))
    }
}

/// The cells a command runs on.
pub struct Selected {
    pub directory: Directory,
    pub cells: Vec<Cell>,
}

impl Selected {
    /// Every cell of the directory is selected: checks across cells apply.
    pub fn whole(&self) -> bool {
        self.cells.len() == self.directory.cells().len()
    }

    /// The cell of a flow built on one of the selected cells.
    pub fn place(&self, cell: &Cell) -> asiento_app::payments::CellPlace {
        asiento_app::payments::CellPlace {
            number: cell.number,
            home: cell.name == self.directory.home().name,
            moved_out: cell
                .moved_out
                .iter()
                .filter_map(|tenant| TenantId::parse(tenant).ok())
                .collect(),
            paused: self.directory.paused.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const TWO_CELLS: &str = r#"{
        "cells": {
            "eu2": { "number": 2, "database_url": "postgres://b/asiento" },
            "eu1": { "number": 1, "database_url": "postgres://a/asiento",
                     "read_database_urls": ["postgres://a2/asiento"] }
        },
        "tenants": { "acme": "eu1", "globex": "eu2" }
    }"#;

    #[test]
    fn a_directory_places_each_tenant_in_one_cell() {
        let directory = Directory::parse(TWO_CELLS).unwrap();
        let names: Vec<&str> = directory.cells().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["eu1", "eu2"]);
        let globex = TenantId::parse("globex").unwrap();
        assert_eq!(directory.cell_of_tenant(&globex).unwrap().name, "eu2");
        assert!(directory
            .cell_of_tenant(&TenantId::parse("initech").unwrap())
            .is_none());
        assert_eq!(directory.home().name, "eu1");
        let two = CellNumber::new(2).unwrap();
        assert_eq!(directory.cell_numbered(two).unwrap().name, "eu2");
        assert_eq!(directory.select(&["eu2".to_owned()]).unwrap().len(), 1);
        assert!(directory.select(&["eu3".to_owned()]).is_err());
    }

    #[test]
    fn a_directory_that_contradicts_itself_is_refused() {
        for (bad, why) in [
            (r#"{"cells": {}, "tenants": {}}"#, "no cell"),
            (
                r#"{"cells": {"a": {"number": 1, "database_url": "x"}, "b": {"number": 1, "database_url": "y"}}, "tenants": {}}"#,
                "same number",
            ),
            (
                r#"{"cells": {"a": {"number": 0, "database_url": "x"}}, "tenants": {}}"#,
                "cell number",
            ),
            (
                r#"{"cells": {"a": {"number": 1, "database_url": "x"}}, "tenants": {"acme": "b"}}"#,
                "no cell",
            ),
            (
                r#"{"cells": {"a": {"number": 1, "database_url": "x"}}, "home": "b", "tenants": {}}"#,
                "no cell",
            ),
            (
                r#"{"cells": {"a": {"number": 1, "database_url": "x", "url": "y"}}, "tenants": {}}"#,
                "unknown field",
            ),
            (
                r#"{"cells": {"a": {"number": 1, "database_url": "x"}}, "tenants": {}, "paused": ["acme"]}"#,
                "in no cell",
            ),
            (
                r#"{"cells": {"a": {"number": 1, "database_url": "x", "moved_out": ["acme"]}}, "tenants": {"acme": "a"}}"#,
                "not placed in another cell",
            ),
        ] {
            let error = format!("{:#}", Directory::parse(bad).unwrap_err());
            assert!(error.contains(why), "{bad}: {error}");
        }
    }
}
