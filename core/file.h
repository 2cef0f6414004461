// Files as accrue reads and writes them. Reading: the whole of a regular file, with the OS's
// reason (strerror) in every failure and the file name in every message. Writing: an AtomicFile
// writes into a temporary beside the destination and renames it over the destination only after
// every byte reached the disk (write, fsync, close, rename, fsync of the folder), so a crash or
// a full disk mid-write never destroys the previous good copy. What the destination is decides
// how it is written:
//   missing or a regular file   temporary and rename (through symbolic links: the link stays,
//                               its target is replaced)
//   character device or FIFO    written directly (/dev/null discards, /dev/full fails, a pipe
//                               reads the bytes as they come)
//   folder, socket, block device refused (check_output, before a run starts)
// A file that outgrows `ulimit -f` fails like a full disk (EFBIG) once SIGXFSZ is ignored, which
// the training engine does. Read next: optim/safetensors.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace accrue {

// A regular file opened for reading, for formats whose header says how large the rest must be:
// the header is read and checked against size() before the rest is allocated. Throws FileError
// naming the file: missing, unreadable, a directory or other non-regular file, or a short read.
class RegularFile {
 public:
  explicit RegularFile(const std::string& path);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // The n bytes from offset on (offset + n at most size()).
  std::vector<uint8_t> read(uint64_t offset, uint64_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The bytes of a regular file (RegularFile's checks), refusing one larger than max_bytes before
// reading it: `what` names what the file should be ("a checkpoint description").
std::vector<uint8_t> read_file_bytes(const std::string& path, uint64_t max_bytes = UINT64_MAX,
                                     const char* what = "this file");

// What an output path names, following symbolic links.
enum class OutputKind {
  kNew,      // nothing there yet: created by a rename
  kRegular,  // replaced by a rename
  kStream,   // a character device or a FIFO: written directly
};

// Throws FileError naming `what` (the flag) and the path unless an output could be written
// there: a symbolic link loop, a folder, a socket or a block device, a missing or unwritable
// folder are refused. For checking output flags before a long run starts.
OutputKind check_output(const std::string& path, const std::string& what);

// The file a path resolves to through its symbolic links (itself when it is none); a dangling
// link resolves to where its target would be created. Throws FileError on a loop.
std::string resolve_output(const std::string& path);

// Whether path (following links) is a character device or a FIFO: written directly, not
// replaced.
bool is_stream(const std::string& path);

// Whether a file name is one of AtomicFile's temporaries for a file named `target`:
// "<target>.tmp.XXXXXX".
bool is_temporary_of(const std::string& name, const std::string& target);

// Removes the temporaries of path beside it: what a killed writer left behind.
void remove_stale_temporaries(const std::string& path);

class AtomicFile {
 public:
  // Creates the temporary "<path>.tmp.XXXXXX" in the destination's folder (the folder of the
  // file path resolves to), or opens a character device or FIFO for writing.
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
  std::string path_, temp_, target_;  // target_: what path_ resolves to, renamed over
  int fd_ = -1;
  bool committed_ = false;
  bool stream_ = false;
};

}  // namespace accrue
