// Files as accrue reads and writes them. Reading: the whole of a regular file, with the OS's
// reason (strerror) in every failure and the file name in every message. Writing: an AtomicFile
// writes into a temporary beside the destination and renames it over the destination only after
// every byte reached the disk (write, fsync, close, rename, fsync of the folder), so a crash or
// a full disk mid-write never destroys the previous good copy. Read next: optim/safetensors.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace accrue {

// The bytes of a regular file. Throws FileError naming the file: missing, unreadable, a
// directory or other non-regular file, or a short read.
std::vector<uint8_t> read_file_bytes(const std::string& path);

// Throws FileError unless a file could be created at path: its folder exists and is writable,
// and path is not a folder. For checking output flags before a long run starts.
void check_writable(const std::string& path, const std::string& what);

class AtomicFile {
 public:
  // Creates the temporary "<path>.tmp.XXXXXX" in the destination's folder.
  explicit AtomicFile(std::string path);
  // Removes the temporary unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Unbuffered (write(2)): what was written is in the temporary at once, so a log written this
  // way survives a crash there.
  void write(const void* data, size_t nbytes);
  void write(const std::string& text) { write(text.data(), text.size()); }
  // fsync, close, rename over the destination, fsync the folder. Throws FileError on failure
  // (the destination is then untouched and the temporary removed).
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  std::string path_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace accrue
