//! Set Features and Get Features (Base 5.27 and 5.15): the features a fabrics controller keeps,
//! their current values, defaults and capabilities (the codes are `fp_nvme_spec::features`'s). Nothing is saveable (ONCS bit 4 cleared), so
//! Set with SV is refused and Get of the saved value answers the default (Base 5.15.1).

use fp_nvme_spec::features::*;
use fp_nvme_spec::Sqe;

/// The over temperature threshold reported by default: 343 K (70 °C). There is no sensor
/// (the SMART page's temperature is 0), so no threshold is ever crossed.
const DEFAULT_OVER_TEMPERATURE: u16 = 343;
/// The Keep Alive Timer's granularity (KAS = 1: 100 ms).
const KATO_GRANULARITY_MS: u32 = 100;

/// Why a Set or Get Features fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FeatureError {
    #[error("feature or value not supported")]
    InvalidField,
    #[error("feature not saveable")]
    NotSaveable,
    #[error("feature not changeable")]
    NotChangeable,
}

/// What the controller's configuration fixes about the features.
#[derive(Debug, Clone, Copy)]
pub struct FeatureLimits {
    pub discovery: bool,
    /// Some namespace has a volatile write cache (Identify Controller VWC).
    pub volatile_cache: bool,
    pub max_io_queues: u16,
    /// The asynchronous events the controller can report (Identify Controller OAES, plus
    /// the SMART critical warnings bits 7:0 for I/O controllers).
    pub events: u32,
}

/// A Set Features that changed something the controller acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureEffect {
    None,
    /// The Keep Alive Timer is now this many milliseconds (0: off).
    KeepAlive(u32),
}

/// The features' current values.
#[derive(Debug, Clone)]
pub struct Features {
    arbitration: u32,
    over_temperature: u16,
    under_temperature: u16,
    error_recovery: u32,
    /// Zero-based queue counts granted by Set Features Number of Queues, if the host asked.
    queues: Option<u16>,
    async_event_config: u32,
    kato_ms: u32,
}

/// A KATO rounded up to the timer's granularity (Base 5.27.1.12).
pub fn round_kato(ms: u32) -> u32 {
    ms.div_ceil(KATO_GRANULARITY_MS).saturating_mul(KATO_GRANULARITY_MS)
}

impl Features {
    pub fn new(kato_ms: u32) -> Features {
        Features {
            arbitration: 0,
            over_temperature: DEFAULT_OVER_TEMPERATURE,
            under_temperature: 0,
            error_recovery: 0,
            queues: None,
            async_event_config: 0,
            kato_ms: round_kato(kato_ms),
        }
    }

    pub fn async_event_config(&self) -> u32 {
        self.async_event_config
    }

    pub fn kato_ms(&self) -> u32 {
        self.kato_ms
    }

    /// I/O queue pairs the host may create.
    pub fn io_queues_allowed(&self, limits: &FeatureLimits) -> u16 {
        match self.queues {
            Some(q) => (q.saturating_add(1)).min(limits.max_io_queues),
            None => limits.max_io_queues,
        }
    }

    /// Discovery controllers keep only the Keep Alive Timer and the event configuration
    /// (Fabrics 5).
    fn supported(fid: u8, limits: &FeatureLimits) -> bool {
        match fid {
            FID_KEEP_ALIVE_TIMER | FID_ASYNC_EVENT_CONFIG => true,
            FID_VOLATILE_WRITE_CACHE => !limits.discovery && limits.volatile_cache,
            FID_ARBITRATION
            | FID_POWER_MANAGEMENT
            | FID_TEMPERATURE_THRESHOLD
            | FID_ERROR_RECOVERY
            | FID_NUMBER_OF_QUEUES
            | FID_HOST_IDENTIFIER => !limits.discovery,
            _ => false,
        }
    }

    /// Set Features: dword 0 of the completion, and what changed.
    pub fn set(&mut self, sqe: &Sqe, limits: &FeatureLimits) -> Result<(u32, FeatureEffect), FeatureError> {
        let cdw10 = sqe.cdw(10);
        let fid = cdw10 as u8;
        let v = sqe.cdw(11);
        if !Self::supported(fid, limits) {
            return Err(FeatureError::InvalidField);
        }
        if cdw10 & SET_SV != 0 {
            return Err(FeatureError::NotSaveable);
        }
        match fid {
            FID_ARBITRATION => self.arbitration = v,
            // One power state (NPSS 0) and no workload hints: only PS 0, WH 0 (bits 7:0).
            FID_POWER_MANAGEMENT if v & 0xFF != 0 => return Err(FeatureError::InvalidField),
            FID_POWER_MANAGEMENT => {}
            FID_TEMPERATURE_THRESHOLD => {
                let (tmpsel, thsel) = ((v >> 16) & 0xF, (v >> 20) & 0x3);
                if !matches!(tmpsel, TMPSEL_COMPOSITE | TMPSEL_ALL) {
                    return Err(FeatureError::InvalidField);
                }
                match thsel {
                    0 => self.over_temperature = v as u16,
                    1 => self.under_temperature = v as u16,
                    _ => return Err(FeatureError::InvalidField),
                }
            }
            // DULBE needs NSFEAT bit 2, which the namespaces do not report.
            FID_ERROR_RECOVERY if v & ERROR_RECOVERY_DULBE != 0 => return Err(FeatureError::InvalidField),
            FID_ERROR_RECOVERY => self.error_recovery = v & 0xFFFF,
            // The bdevs' caches cannot be switched off from here: write back (WCE 1) only.
            FID_VOLATILE_WRITE_CACHE if v & 1 == 0 => return Err(FeatureError::NotChangeable),
            FID_VOLATILE_WRITE_CACHE => {}
            FID_NUMBER_OF_QUEUES => {
                let (nsqr, ncqr) = (v as u16, (v >> 16) as u16);
                // FFFFh asks for 65536 queues, which is invalid (Base 5.27.1.7).
                if nsqr == u16::MAX || ncqr == u16::MAX {
                    return Err(FeatureError::InvalidField);
                }
                // A fabrics queue is a submission and completion queue pair: grant the smaller.
                let granted = nsqr.min(ncqr).min(limits.max_io_queues.saturating_sub(1));
                self.queues = Some(granted);
                return Ok((queues_dw0(granted), FeatureEffect::None));
            }
            FID_ASYNC_EVENT_CONFIG => self.async_event_config = v & limits.events,
            FID_KEEP_ALIVE_TIMER => {
                self.kato_ms = round_kato(v);
                return Ok((0, FeatureEffect::KeepAlive(self.kato_ms)));
            }
            // Fabrics hosts give their identifier in Connect (Fabrics 3.3).
            FID_HOST_IDENTIFIER => return Err(FeatureError::InvalidField),
            _ => return Err(FeatureError::InvalidField),
        }
        Ok((0, FeatureEffect::None))
    }

    /// Get Features: dword 0 of the completion and the data (Host Identifier only).
    pub fn get(
        &self,
        sqe: &Sqe,
        limits: &FeatureLimits,
        hostid: &[u8; 16],
    ) -> Result<(u32, Vec<u8>), FeatureError> {
        let cdw10 = sqe.cdw(10);
        let fid = cdw10 as u8;
        let sel = (cdw10 >> SEL_SHIFT) & 0x7;
        if !Self::supported(fid, limits) {
            return Err(FeatureError::InvalidField);
        }
        let current = match sel {
            SEL_CURRENT => true,
            SEL_DEFAULT | SEL_SAVED => false,
            SEL_SUPPORTED => return Ok((Self::capabilities(fid), Vec::new())),
            _ => return Err(FeatureError::InvalidField),
        };
        let defaults = Features::new(0);
        let f = if current { self } else { &defaults };
        let dw0 = match fid {
            FID_ARBITRATION => f.arbitration,
            FID_POWER_MANAGEMENT => 0,
            FID_TEMPERATURE_THRESHOLD => {
                let v = sqe.cdw(11);
                match ((v >> 16) & 0xF, (v >> 20) & 0x3) {
                    (TMPSEL_COMPOSITE, 0) => u32::from(f.over_temperature),
                    (TMPSEL_COMPOSITE, 1) => u32::from(f.under_temperature) | (1 << 20),
                    _ => return Err(FeatureError::InvalidField),
                }
            }
            FID_ERROR_RECOVERY => f.error_recovery,
            FID_VOLATILE_WRITE_CACHE => 1,
            FID_NUMBER_OF_QUEUES => {
                let max = limits.max_io_queues.saturating_sub(1);
                queues_dw0(if current { self.queues.unwrap_or(max) } else { max })
            }
            FID_ASYNC_EVENT_CONFIG => f.async_event_config,
            // The default is what Connect set; "saved" has nothing else to answer.
            FID_KEEP_ALIVE_TIMER => self.kato_ms,
            FID_HOST_IDENTIFIER => {
                if sqe.cdw(11) & HOST_ID_EXHID == 0 {
                    return Err(FeatureError::InvalidField);
                }
                return Ok((HOST_ID_EXHID, hostid.to_vec()));
            }
            _ => return Err(FeatureError::InvalidField),
        };
        Ok((dw0, Vec::new()))
    }

    fn capabilities(fid: u8) -> u32 {
        match fid {
            FID_ERROR_RECOVERY => CAP_CHANGEABLE | CAP_NAMESPACE_SPECIFIC,
            FID_HOST_IDENTIFIER | FID_POWER_MANAGEMENT | FID_VOLATILE_WRITE_CACHE => 0,
            _ => CAP_CHANGEABLE,
        }
    }
}

/// Number of Queues' dword 0: NSQA bits 15:0 and NCQA bits 31:16, both zero-based.
fn queues_dw0(zero_based: u16) -> u32 {
    u32::from(zero_based) | (u32::from(zero_based) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVM: FeatureLimits =
        FeatureLimits { discovery: false, volatile_cache: true, max_io_queues: 8, events: 0x1FF };
    const DISC: FeatureLimits =
        FeatureLimits { discovery: true, volatile_cache: false, max_io_queues: 0, events: 1 << 31 };

    fn cmd(cdw10: u32, cdw11: u32) -> Sqe {
        let mut s = Sqe([0; 64]);
        s.0[40..44].copy_from_slice(&cdw10.to_le_bytes());
        s.0[44..48].copy_from_slice(&cdw11.to_le_bytes());
        s
    }

    #[test]
    fn number_of_queues_grants_the_smaller_and_caps() {
        let mut f = Features::new(0);
        assert_eq!(f.io_queues_allowed(&NVM), 8);
        // NSQR 3, NCQR 5 (zero-based): 4 pairs.
        assert_eq!(f.set(&cmd(0x07, 3 | (5 << 16)), &NVM), Ok((3 | (3 << 16), FeatureEffect::None)));
        assert_eq!(f.io_queues_allowed(&NVM), 4);
        assert_eq!(f.get(&cmd(0x07, 0), &NVM, &[0; 16]), Ok((3 | (3 << 16), Vec::new())));
        assert_eq!(
            f.get(&cmd(0x07 | (1 << 8), 0), &NVM, &[0; 16]),
            Ok((7 | (7 << 16), Vec::new())),
            "default"
        );
        assert_eq!(f.set(&cmd(0x07, 100 | (100 << 16)), &NVM), Ok((7 | (7 << 16), FeatureEffect::None)));
        assert_eq!(f.set(&cmd(0x07, 0xFFFF), &NVM), Err(FeatureError::InvalidField));
        assert_eq!(f.set(&cmd(0x07, 0), &DISC), Err(FeatureError::InvalidField), "not on discovery");
    }

    #[test]
    fn keep_alive_rounds_to_granularity() {
        let mut f = Features::new(4950);
        assert_eq!(f.kato_ms(), 5000);
        assert_eq!(f.set(&cmd(0x0F, 1), &DISC), Ok((0, FeatureEffect::KeepAlive(100))));
        assert_eq!(f.get(&cmd(0x0F, 0), &DISC, &[0; 16]), Ok((100, Vec::new())));
        assert_eq!(f.set(&cmd(0x0F, 0), &NVM), Ok((0, FeatureEffect::KeepAlive(0))));
        assert_eq!(f.set(&cmd(0x0F | SET_SV, 10), &NVM), Err(FeatureError::NotSaveable));
    }

    #[test]
    fn async_event_config_keeps_supported_bits() {
        let mut f = Features::new(0);
        f.set(&cmd(0x0B, u32::MAX), &NVM).unwrap();
        assert_eq!(f.async_event_config(), 0x1FF);
        f.set(&cmd(0x0B, u32::MAX), &DISC).unwrap();
        assert_eq!(f.async_event_config(), 1 << 31);
        assert_eq!(f.get(&cmd(0x0B | (1 << 8), 0), &DISC, &[0; 16]), Ok((0, Vec::new())), "default off");
    }

    #[test]
    fn the_rest_answered_sensibly() {
        let mut f = Features::new(0);
        assert_eq!(f.get(&cmd(0x04, 0), &NVM, &[0; 16]), Ok((343, Vec::new())));
        f.set(&cmd(0x04, 300), &NVM).unwrap();
        assert_eq!(f.get(&cmd(0x04, 0), &NVM, &[0; 16]).unwrap().0, 300);
        assert_eq!(f.set(&cmd(0x04, 300 | (1 << 16)), &NVM), Err(FeatureError::InvalidField), "sensor 1");
        assert_eq!(f.set(&cmd(0x02, 1), &NVM), Err(FeatureError::InvalidField), "power state 1");
        assert_eq!(f.set(&cmd(0x02, 0), &NVM), Ok((0, FeatureEffect::None)));
        assert_eq!(f.set(&cmd(0x05, 1 << 16), &NVM), Err(FeatureError::InvalidField), "DULBE");
        f.set(&cmd(0x01, 0x0303_0307), &NVM).unwrap();
        assert_eq!(f.get(&cmd(0x01, 0), &NVM, &[0; 16]).unwrap().0, 0x0303_0307);
        assert_eq!(f.get(&cmd(0x06, 0), &NVM, &[0; 16]).unwrap().0, 1, "write cache on");
        assert_eq!(f.set(&cmd(0x06, 0), &NVM), Err(FeatureError::NotChangeable));
        let no_cache = FeatureLimits { volatile_cache: false, ..NVM };
        assert_eq!(f.get(&cmd(0x06, 0), &no_cache, &[0; 16]), Err(FeatureError::InvalidField));
        let hostid = [7u8; 16];
        assert_eq!(f.get(&cmd(0x81, 1), &NVM, &hostid), Ok((1, hostid.to_vec())));
        assert_eq!(f.get(&cmd(0x81, 0), &NVM, &hostid), Err(FeatureError::InvalidField));
        assert_eq!(f.get(&cmd(0x0C, 0), &NVM, &hostid), Err(FeatureError::InvalidField), "APST");
        assert_eq!(f.get(&cmd(0x07 | (3 << 8), 0), &NVM, &hostid), Ok((CAP_CHANGEABLE, Vec::new())));
        assert_eq!(f.get(&cmd(0x07 | (5 << 8), 0), &NVM, &hostid), Err(FeatureError::InvalidField));
    }
}
