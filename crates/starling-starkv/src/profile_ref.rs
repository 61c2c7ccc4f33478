//! Which checkpoint of a calibration run to load: a named profile, or a share removed.

use std::fmt;
use std::str::FromStr;

use crate::checkpoint::Manifest;
use crate::{BudgetTarget, RankProfile, StarKvError};

/// A named [`RankProfile`], or a share of K/V elements removed, as `starling calibrate
/// --profiles 55%` writes it (`removed-55pct`, or `removed-555permille` for a share with a
/// tenth of a percent). Parsed from the profile's name, the folder name, or `55%`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProfileRef {
    /// A named profile.
    Named(RankProfile),
    /// A share removed, without a name.
    Removed(BudgetTarget),
}

impl ProfileRef {
    /// The checkpoint folder's name under a calibration's output directory.
    pub fn dir_name(self) -> String {
        match self {
            Self::Named(profile) => profile.name().to_owned(),
            Self::Removed(target) if target.permille() % 10 == 0 => {
                format!("removed-{}pct", target.permille() / 10)
            }
            Self::Removed(target) => format!("removed-{}permille", target.permille()),
        }
    }

    /// The share it removes.
    pub fn target(self) -> BudgetTarget {
        match self {
            Self::Named(profile) => profile.target(),
            Self::Removed(target) => target,
        }
    }

    /// The named profile, if it is one.
    pub fn profile(self) -> Option<RankProfile> {
        match self {
            Self::Named(profile) => Some(profile),
            Self::Removed(_) => None,
        }
    }

    /// Whether `manifest` is this profile's checkpoint: the same named profile, or no name
    /// and the same share.
    pub fn matches(self, manifest: &Manifest) -> bool {
        match self {
            Self::Named(profile) => manifest.profile == Some(profile),
            Self::Removed(target) => {
                manifest.profile.is_none() && manifest.removed_permille == target.permille()
            }
        }
    }
}

impl From<RankProfile> for ProfileRef {
    fn from(profile: RankProfile) -> Self {
        Self::Named(profile)
    }
}

impl fmt::Display for ProfileRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.dir_name())
    }
}

fn share_permille(text: &str, scale: f64) -> Option<u32> {
    let value: f64 = text.trim().parse().ok()?;
    let permille = (value * scale).round();
    (value.is_finite()
        && (permille - value * scale).abs() < 1e-6
        && (1.0..=999.0).contains(&permille))
    .then_some(permille as u32)
}

impl FromStr for ProfileRef {
    type Err = StarKvError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let share = if let Some(percent) = text.strip_suffix('%') {
            Some(share_permille(percent, 10.0))
        } else if let Some(rest) = text.strip_prefix("removed-") {
            if let Some(percent) = rest.strip_suffix("pct") {
                Some(share_permille(percent, 10.0))
            } else {
                rest.strip_suffix("permille")
                    .map(|permille| share_permille(permille, 1.0))
            }
        } else {
            None
        };
        match share {
            Some(Some(permille)) => Ok(Self::Removed(BudgetTarget::removed_permille(permille)?)),
            Some(None) => Err(StarKvError::InvalidArgument(format!(
                "`{text}`: a share removed must be between 0.1% and 99.9%, in steps of 0.1%"
            ))),
            None => Ok(Self::Named(text.parse().map_err(|_| {
                StarKvError::InvalidArgument(format!(
                    "unknown rank profile `{text}` (known: aggressive, balanced, conservative, \
                     or a share removed such as 55% / removed-55pct)"
                ))
            })?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_shares_and_folder_names_parse_and_round_trip() {
        let balanced: ProfileRef = "balanced".parse().unwrap();
        assert_eq!(balanced, ProfileRef::Named(RankProfile::Balanced));
        assert_eq!(balanced.dir_name(), "balanced");
        let half: ProfileRef = "50%".parse().unwrap();
        assert_eq!(half.target().permille(), 500);
        assert_eq!(half.dir_name(), "removed-50pct");
        assert_eq!("removed-50pct".parse::<ProfileRef>().unwrap(), half);
        let odd: ProfileRef = "55.5%".parse().unwrap();
        assert_eq!(odd.dir_name(), "removed-555permille");
        assert_eq!(odd.dir_name().parse::<ProfileRef>().unwrap(), odd);
        for bad in [
            "0%",
            "100%",
            "12.34%",
            "x%",
            "removed-abcpct",
            "removed-0permille",
            "huge",
        ] {
            assert!(bad.parse::<ProfileRef>().is_err(), "{bad}");
        }
    }
}
