//! `starling calibrate --profiles`: which checkpoints a run writes, named profiles or shares.

use anyhow::{bail, Result};
use starling_starkv::{BudgetTarget, CalibrationPlan, ProfileRef, RankProfile, RankStrategy};

/// A profile to write: a named one, or a share removed (`55%`), and its folder's name.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ProfileChoice {
    /// The checkpoint folder's name.
    pub(crate) name: String,
    /// The named profile, if it is one.
    pub(crate) profile: Option<RankProfile>,
    /// The share it removes.
    pub(crate) target: BudgetTarget,
}

impl ProfileChoice {
    pub(crate) fn parse(text: &str) -> Result<Self> {
        let chosen: ProfileRef = text.parse()?;
        Ok(Self {
            name: chosen.dir_name(),
            profile: chosen.profile(),
            target: chosen.target(),
        })
    }

    pub(crate) fn plan(&self, strategy: RankStrategy, seed: u64) -> CalibrationPlan {
        let mut plan = CalibrationPlan::for_profile(
            self.profile.unwrap_or(RankProfile::Balanced),
            strategy,
            seed,
        );
        plan.profile = self.profile;
        plan.target = self.target;
        plan
    }
}

/// The profiles named on the command line, in order, each share once.
pub(crate) fn parse_profiles(names: &[String]) -> Result<Vec<ProfileChoice>> {
    let mut profiles: Vec<ProfileChoice> = Vec::with_capacity(names.len());
    for name in names {
        let choice = ProfileChoice::parse(name)?;
        if profiles.iter().any(|p| p.target == choice.target) {
            bail!("--profiles names the share of `{}` twice", choice.name);
        }
        profiles.push(choice);
    }
    if profiles.is_empty() {
        bail!("--profiles is empty");
    }
    Ok(profiles)
}
