//! CRC-32C (Castagnoli) as Tarantool's `digest.crc32` computes it, which vshard hashes keys with:
//! reflected polynomial 0x82F63B78, initial value 0xFFFFFFFF and *no* final xor. Because there is
//! no final xor, the running value is the result, so hashing parts one after another
//! (`crc32.new()` then `:update()` per part, as vshard does for a composite key) equals hashing
//! their concatenation.

/// The value a fresh CRC starts from (`digest.crc32.new()`).
pub const CRC32C_INIT: u32 = 0xFFFF_FFFF;

const POLY: u32 = 0x82F6_3B78;

/// Slicing-by-8 tables: `TABLES[0]` is the classic byte-at-a-time table; `TABLES[k][b]` is the CRC
/// of byte `b` followed by `k` zero bytes.
static TABLES: [[u32; 256]; 8] = build_tables();

const fn build_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut b = 0;
    while b < 256 {
        let mut crc = b as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][b] = crc;
        b += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut b = 0;
        while b < 256 {
            let prev = tables[k - 1][b];
            tables[k][b] = (prev >> 8) ^ tables[0][(prev & 0xff) as usize];
            b += 1;
        }
        k += 1;
    }
    tables
}

/// Feeds `data` into the running CRC `crc` and returns the new running value (which, with no
/// final xor, is also the hash).
#[inline]
pub fn crc32c_update(mut crc: u32, data: &[u8]) -> u32 {
    let t = &TABLES;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let lo = crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        crc = t[7][(lo & 0xff) as usize]
            ^ t[6][((lo >> 8) & 0xff) as usize]
            ^ t[5][((lo >> 16) & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][c[4] as usize]
            ^ t[2][c[5] as usize]
            ^ t[1][c[6] as usize]
            ^ t[0][c[7] as usize];
    }
    for &byte in chunks.remainder() {
        crc = (crc >> 8) ^ t[0][((crc ^ u32::from(byte)) & 0xff) as usize];
    }
    crc
}

/// CRC-32C of `data` from [`CRC32C_INIT`], without final xor (Tarantool's `digest.crc32(data)`).
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_update(CRC32C_INIT, data)
}

#[cfg(test)]
mod tests {
    use super::{crc32c, crc32c_update, CRC32C_INIT};

    /// Bit-at-a-time definition, to check the table-driven version against.
    fn bitwise(mut crc: u32, data: &[u8]) -> u32 {
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
        }
        crc
    }

    #[test]
    fn check_value() {
        // The standard CRC-32C check value is 0xE3069283 *with* the final xor.
        assert_eq!(crc32c(b"123456789") ^ 0xFFFF_FFFF, 0xE306_9283);
        assert_eq!(crc32c(b"123456789"), 0x1CF9_6D7C);
        assert_eq!(crc32c(b""), CRC32C_INIT);
    }

    #[test]
    fn vshard_vectors() {
        // Tarantool vshard test/unit/router.result, bucket_count 3000.
        let cases: [(&[u8], u32); 7] = [
            (b"1", 477),
            (b"1LL", 730),
            (b"1ULL", 982),
            (&[0x01], 1614),
            (&[0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0], 1411),
            (&[0xca, 0x3f, 0x80, 0, 0], 193),
            (&[0xd5, 0x01, 0x00, 0x1c], 1696),
        ];
        for (data, bucket) in cases {
            assert_eq!(crc32c(data) % 3000 + 1, bucket, "{data:02x?}");
        }
    }

    #[test]
    fn chaining_equals_concatenation() {
        let data: Vec<u8> = (0..1000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let whole = crc32c(&data);
        for split in [0, 1, 3, 7, 8, 9, 100, 999, 1000] {
            let (a, b) = data.split_at(split);
            assert_eq!(crc32c_update(crc32c(a), b), whole, "split at {split}");
        }
    }

    #[test]
    fn table_driven_matches_bitwise() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in 0..data.len() {
            assert_eq!(
                crc32c(&data[..len]),
                bitwise(CRC32C_INIT, &data[..len]),
                "len {len}"
            );
        }
    }
}
