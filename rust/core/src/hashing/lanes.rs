//! `Lanes`: the widest vector instructions this CPU has for the lane-wise key loops
//! (`int_lanes`, `str_lanes`), detected at run time, never at build time, so one wheel
//! runs on every x86-64.

/// How many keys one instruction works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lanes {
    /// 16 keys per instruction (AVX-512 F, BW and VL).
    Avx512,
    /// 8 keys per instruction.
    Avx2,
    /// One key at a time: each loop says what it does then.
    Scalar,
}

impl Lanes {
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512vl") {
                return Lanes::Avx512;
            }
            if has!("avx2") {
                return Lanes::Avx2;
            }
        }
        Lanes::Scalar
    }

    /// Every width this CPU can run, narrowest first: what a test compares with the scalar form.
    #[cfg(test)]
    pub fn available() -> Vec<Self> {
        match Self::detect() {
            Lanes::Avx512 => vec![Lanes::Scalar, Lanes::Avx2, Lanes::Avx512],
            Lanes::Avx2 => vec![Lanes::Scalar, Lanes::Avx2],
            Lanes::Scalar => vec![Lanes::Scalar],
        }
    }
}
