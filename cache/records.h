// What cache.cc's records share with the records kept beside the cache's
// own (cache_records.cc): RocksDB statuses, the clock, sealed records.
// Internal to cache/.
#ifndef KILN_CACHE_RECORDS_H_
#define KILN_CACHE_RECORDS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "rocksdb/status.h"

namespace kiln::cache::internal {

// The one place rocksdb::Status becomes absl::Status.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what);

int64_t NowMicros();

// Every record but the artifacts is sealed: its bytes, their SHA-256 and a
// marker (docs/cache.md).
std::string Seal(const google::protobuf::Message& m);

// Parses a record into `m`. `sealed` tells whether it carried a seal;
// DATA_LOSS when the seal does not match or the bytes do not parse.
absl::Status Unseal(absl::string_view value, google::protobuf::Message* m, bool* sealed,
                    absl::string_view what);

}  // namespace kiln::cache::internal

#endif  // KILN_CACHE_RECORDS_H_
