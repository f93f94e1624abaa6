//! Choices a user makes by name (`--backend cpu`, `--algo ring`): each lower layer's enum says
//! its values and their names here, and knows nothing of the command line; the settings layer
//! ([`crate::settings`]) turns them into flags.

/// An enum whose values a user names.
pub trait Named: Copy + PartialEq + Send + Sync + 'static {
    /// Every value, in the order a user is shown them.
    const ALL: &'static [Self];

    /// The name a user types.
    fn name(self) -> &'static str;

    /// The value named `name`, if one is.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == name)
    }
}
