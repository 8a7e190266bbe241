/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as google_crc32c computes it.
 * Pure algorithm: no module API, no libfabric. */
#ifndef LMCV_CRC32C_H
#define LMCV_CRC32C_H
#include <stddef.h>
#include <stdint.h>

/* Continue a CRC: pass 0 to start. */
uint32_t lmcv_crc32c(uint32_t crc, const void *buf, size_t len);

#endif
