// Hostile input, one table per kind: corrupt IDX files, corrupt safetensors files, bad command
// lines and runs that must fail. Every file is made here by the test; every row names the words
// its error must contain (the file, the tensor, the flag, the value). A failed save leaves the
// previous good file as it was.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "mnist_fixture.h"
#include "train/checkpoint.h"
#include "train/run.h"

namespace accrue::testing {
namespace {

std::string big_endian(std::initializer_list<uint32_t> words) {
  std::string out;
  for (uint32_t v : words) out += {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  return out;
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// ---- IDX ----

struct IdxCase {
  std::string name;
  std::string bytes;  // the file's content
  bool images;        // read as images (else labels)
  std::vector<std::string> words;
};

TEST(BadInput, IdxFilesAreRejectedNamingFileAndFault) {
  const std::string pixels(2 * 3 * 3, '\x7f');
  const std::vector<IdxCase> table{
      {"truncated_header", big_endian({0x803, 2}), true, {"truncated header", "8 bytes"}},
      {"empty", "", true, {"truncated header", "0 bytes"}},
      {"truncated_data",
       big_endian({0x803, 2, 3, 3}) + pixels.substr(1),
       true,
       {"declares [2, 3, 3]", "(truncated)"}},
      {"trailing_bytes", big_endian({0x803, 2, 3, 3}) + pixels + "x", true, {"trailing bytes"}},
      {"not_idx", "GIF89a" + pixels, true, {"not an IDX file"}},
      {"float_elements",
       big_endian({0x0D03, 2, 3, 3}) + pixels,
       true,
       {"element type byte 0xd", "unsigned byte"}},
      {"labels_as_images",
       big_endian({0x801, 18}) + pixels,
       true,
       {"1 dimension(s)", "images have 3", "magic 0x801", "0x803"}},
      {"four_dimensions", big_endian({0x804, 2, 3, 3, 1}) + pixels, true, {"4 dimension(s)"}},
      {"images_as_labels",
       big_endian({0x803, 2, 3, 3}) + pixels,
       false,
       {"3 dimension(s)", "labels have 1"}},
      // 2^24 x 2^24 x 2^16 = 2^64 wraps to 0 in 64-bit arithmetic: it must not pass as "no data".
      {"overflowing_dimensions",
       big_endian({0x803, 1u << 24, 1u << 24, 1u << 16}),
       true,
       {"overflow"}},
      {"huge_count",
       big_endian({0x801, 0xffffffffu}) + "\x01",
       false,
       {"4294967295", "(truncated)"}},
      {"zero_width", big_endian({0x803, 2, 0, 3}), true, {"dimensions 0 x 3"}},
  };
  const fs::path dir = temp_dir("bad-idx");
  for (const IdxCase& c : table) {
    const std::string path = (dir / c.name).string();
    write_bytes(path, c.bytes);
    std::vector<std::string> words = c.words;
    words.push_back(path);
    if (c.images) {
      expect_error<FileError>([&] { mnist::read_idx_images(path); }, words);
    } else {
      expect_error<FileError>([&] { mnist::read_idx_labels(path); }, words);
    }
  }
  // A valid header in a 64 GiB sparse file: compared with the size before the data is read.
  const std::string sparse = (dir / "sparse").string();
  write_bytes(sparse, big_endian({0x803, 2, 3, 3}) + pixels);
  fs::resize_file(sparse, uint64_t{64} << 30);
  expect_error<FileError>([&] { mnist::read_idx_images(sparse); },
                          {sparse, "declares [2, 3, 3]", "(trailing bytes)"});
  fs::remove(sparse);
  // A header that agrees with its (sparse) file of twice this machine's memory: refused naming
  // the file, not a std::bad_alloc, and not read (a fixed 105 GB fit the GPU machine's 128 GiB,
  // and reading it took 132 s).
  const uint64_t memory = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                          static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t images = std::min<uint64_t>(2 * memory / (28 * 28) + 1, 0xffffffffu);
  ASSERT_GT(images * 28 * 28, memory) << "this machine's memory exceeds what IDX can declare";
  const std::string huge = (dir / "huge").string();
  write_bytes(huge, big_endian({0x803, static_cast<uint32_t>(images), 28, 28}));
  fs::resize_file(huge, 16 + images * 28 * 28);
  expect_error<FileError>([&] { mnist::read_idx_images(huge); }, {huge, "bytes of memory"});
  fs::remove(huge);
  // A folder, and a missing file, with the OS's reason.
  expect_error<FileError>([&] { mnist::read_idx_images(dir.string()); },
                          {dir.string(), "is a directory"});
  expect_error<FileError>([&] { mnist::read_idx_images((dir / "missing").string()); },
                          {"missing", "cannot open", "No such file or directory"});
}

TEST(BadInput, DatasetsWithoutSamplesOrOfTwoImageSizesAreRejected) {
  const fs::path data = make_dataset("bad-splits", 64, 16);
  write_idx_images((data / "train-images-idx3-ubyte").string(), {0, 28, 28, {}});
  write_idx_labels((data / "train-labels-idx1-ubyte").string(), {});
  CliResult r = cli({"--data", data.string(), "--quiet"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("train-images-idx3-ubyte: holds no samples"), std::string::npos) << r.err;

  write_fixture(data, "train", 64, 1);
  write_idx_images((data / "t10k-images-idx3-ubyte").string(),
                   {16, 20, 20, std::vector<uint8_t>(16 * 400, 0)});
  r = cli({"--data", data.string(), "--quiet", "--epochs", "1"});
  EXPECT_EQ(r.status, 1);
  for (const char* word : {"t10k-images-idx3-ubyte", "20 x 20", "MNIST's are 28 x 28"}) {
    EXPECT_NE(r.err.find(word), std::string::npos) << word << " in " << r.err;
  }
  // As many pixels as MNIST's, in another shape: not MNIST either.
  write_fixture(data, "t10k", 16, 2);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{14, 56}, {784, 1}}) {
    write_idx_images((data / "train-images-idx3-ubyte").string(),
                     {64, rows, cols, std::vector<uint8_t>(64 * 784, 0)});
    r = cli({"--data", data.string(), "--quiet", "--epochs", "1"});
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find(str_cat("train-images-idx3-ubyte: images are ", rows, " x ", cols)),
              std::string::npos)
        << r.err;
  }
}

// ---- safetensors ----

// A safetensors file from a header text and a data section.
std::string safetensors(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += char(uint64_t(header.size()) >> (8 * i));
  return out + header + data;
}

struct SafetensorsCase {
  std::string name;
  std::string bytes;
  std::vector<std::string> words;
};

TEST(BadInput, SafetensorsFilesAreRejectedNamingFileTensorAndFault) {
  const std::string f32x2(8, '\0');
  const auto one = [&](const std::string& entry) {
    return safetensors(R"({"w":)" + entry + "}", f32x2);
  };
  // A file saved with a digest (optim::with_digest, as --save writes) of {"k": "v"} and zeros.
  const std::string digest =
      optim::with_digest({{"k", "v"}}, {{"w", Tensor::zeros({2})}}).at(optim::kDigestKey);
  const auto digested = [&](const std::string& value, const std::string& data) {
    return safetensors(R"({"__metadata__":{"k":")" + value + R"(","accrue.digest":")" + digest +
                           R"("},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                       data);
  };
  const std::vector<SafetensorsCase> table{
      {"short", "abc", {"truncated", "3 bytes"}},
      {"digest_data_edited",
       digested("v", std::string(7, '\0') + "\x01"),
       {"changed after it was saved", "accrue.digest " + digest}},
      {"digest_metadata_edited",
       digested("v2", f32x2),
       {"changed after it was saved", "accrue.digest " + digest}},
      {"header_past_end",
       std::string("\x10\0\0\0\0\0\0\0{}", 10),
       {"header length 16 exceeds the 2 bytes"}},
      {"not_json", safetensors("{{{{", ""), {"not valid JSON"}},
      {"json_array", safetensors("[1, 2]", ""), {"not a JSON object"}},
      {"entry_not_object", one("7"), {"'w'", "not a JSON object"}},
      {"dtype_number", one(R"({"dtype":5,"shape":[2],"data_offsets":[0,8]})"), {"'w'", "dtype"}},
      {"dtype_unknown",
       one(R"({"dtype":"F8","shape":[2],"data_offsets":[0,8]})"),
       {"'w'", "unsupported dtype"}},
      {"shape_string",
       one(R"({"dtype":"F32","shape":"2","data_offsets":[0,8]})"),
       {"'w'", "shape"}},
      {"offsets_strings",
       one(R"({"dtype":"F32","shape":[2],"data_offsets":["0","8"]})"),
       {"'w'", "bad data offset"}},
      {"offsets_single",
       one(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"),
       {"'w'", "data_offsets"}},
      {"negative_dimension",
       one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"),
       {"'w'", "bad dimension -2"}},
      {"dimension_2_63",
       one(R"({"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]})"),
       {"'w'", "bad dimension 9223372036854775808"}},
      {"count_overflow",
       one(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})"),
       {"'w'", "overflows"}},
      {"byte_overflow",
       one(R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]})"),
       {"'w'", "byte count overflows"}},
      {"offsets_disagree",
       one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
       {"'w'", "data_offsets [0, 8] for 12 bytes", "float32[3]"}},
      {"offsets_disagree_i64",
       one(R"({"dtype":"I64","shape":[2],"data_offsets":[0,8]})"),
       {"'w'", "data_offsets [0, 8] for 16 bytes", "int64[2]"}},
      {"data_truncated",
       one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"),
       {"truncated", "'w'", "ends at byte 16", "8-byte"}},
      {"overlap",
       safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                   f32x2),
       {"'a' [0, 8)", "'b' [4, 8)", "overlap"}},
      {"metadata_not_object", safetensors(R"({"__metadata__":[1]})", ""), {"__metadata__"}},
      {"name_with_nul",
       safetensors(R"({"layers.1.bias\u0000x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                   f32x2),
       {"the tensor name \"layers.1.bias\\u0000x\" holds a NUL byte"}},
      // Copying or printing a value recurses once per level: deep nesting is refused at parse.
      {"nested_deep",
       safetensors(std::string(100000, '[') + std::string(100000, ']'), ""),
       {"not valid JSON", "nested more than 64 levels"}},
      {"key_twice",
       safetensors(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                   f32x2),
       {"the key \"w\" appears twice"}},
      {"trailing_bytes",
       one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})"),
       {"4 bytes after the last tensor's end", "trailing bytes"}},
      {"hole",
       one(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})"),
       {"bytes [0, 4) of the data belong to no tensor", "'w' starts at 4"}},
      // nlohmann::json stops at a NUL as at the end: what follows would go unread.
      {"nul_then_garbage",
       safetensors(std::string(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})") +
                       std::string("\0{{{ not json", 13),
                   f32x2),
       {"not valid JSON", "a NUL byte at offset 54"}},
      {"huge_value_cut_short",
       one(R"({"dtype":"F32","shape":[")" + std::string(100000, 'A') +
           R"("],"data_offsets":[0,8]})"),
       {"'w'", "bad dimension \"AAAA", "(100002 characters)"}},
  };
  const fs::path dir = temp_dir("bad-safetensors");
  for (const SafetensorsCase& c : table) {
    const std::string path = (dir / (c.name + ".safetensors")).string();
    write_bytes(path, c.bytes);
    std::vector<std::string> words = c.words;
    words.push_back(path);
    SCOPED_TRACE(c.name);
    expect_error<FileError>([&] { optim::read_safetensors(path); }, words);
  }
  expect_error<FileError>([&] { optim::read_safetensors(dir.string()); },
                          {dir.string(), "is a directory"});
  // Unedited, the digested file reads back.
  const std::string intact = (dir / "digest_intact.safetensors").string();
  write_bytes(intact, digested("v", f32x2));
  EXPECT_EQ(optim::read_safetensors(intact).at("w").numel(), 2);
  // A valid header in a 64 GiB sparse file: refused from the header and the size, before the
  // data is read (reading it would need 64 GiB of memory).
  const std::string sparse = (dir / "sparse.safetensors").string();
  write_bytes(sparse, one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})"));
  fs::resize_file(sparse, uint64_t{64} << 30);
  expect_error<FileError>([&] { optim::read_safetensors(sparse); }, {sparse, "trailing bytes"});
  // Far past the format's 100 MB header limit: refused before the header is read.
  const std::string long_header = (dir / "long_header.safetensors").string();
  write_bytes(long_header, std::string("\x00\xe4\x0b\x54\x02\0\0\0", 8));  // 10^10
  fs::resize_file(long_header, uint64_t{20} << 30);
  expect_error<FileError>([&] { optim::read_safetensors(long_header); },
                          {long_header, "over the format's limit"});
  fs::remove_all(dir);
}

// Loading checks everything before it writes anything: a file that fails leaves the model as it
// was.
TEST(BadInput, LoadingRejectsUnknownNonFiniteAndIntegerTensors) {
  const fs::path dir = temp_dir("bad-load");
  nn::manual_seed(5);
  nn::MLP model({3, 2});
  const auto before = model.parameter("layers.0.weight").to_vector<float>();
  const auto save = [&](const std::string& name, std::vector<nn::NamedTensor> tensors) {
    const std::string path = (dir / name).string();
    optim::save_safetensors(path, tensors);
    return path;
  };
  const Tensor w = Tensor::zeros({2, 3}), b = Tensor::zeros({2});
  std::string path = save("extra.safetensors",
                          {{"layers.0.weight", w}, {"layers.0.bias", b}, {"layers.9.weight", w}});
  expect_error<FileError>([&] { optim::load_parameters(model, path); },
                          {path, "'layers.9.weight'", "does not have", "layers.0.bias"});
  for (double bad : {NAN, INFINITY, -INFINITY}) {
    Tensor nb = Tensor::zeros({2});
    nb.data<float>()[1] = static_cast<float>(bad);
    path = save("nonfinite.safetensors", {{"layers.0.weight", w}, {"layers.0.bias", nb}});
    expect_error<FileError>([&] { optim::load_parameters(model, path); },
                            {path, "'layers.0.bias'", "element 1", "must be finite"});
  }
  // Finite as stored, infinite in the parameter's float32.
  Tensor wide = Tensor::zeros({2}, DType::kFloat64);
  wide.data<double>()[1] = 1e300;
  path = save("wide.safetensors", {{"layers.0.weight", w}, {"layers.0.bias", wide}});
  expect_error<FileError>(
      [&] { optim::load_parameters(model, path); },
      {path, "'layers.0.bias' holds 1e+300 at element 1, inf in float32", "must be finite"});
  path = save("int.safetensors",
              {{"layers.0.weight", Tensor::zeros({2, 3}, DType::kInt32)}, {"layers.0.bias", b}});
  expect_error<FileError>([&] { optim::load_parameters(model, path); },
                          {path, "'layers.0.weight'", "int32[2, 3]", "expects float32[2, 3]"});
  path = save("int64.safetensors",
              {{"layers.0.weight", w}, {"layers.0.bias", Tensor::zeros({2}, DType::kInt64)}});
  expect_error<FileError>([&] { optim::load_parameters(model, path); },
                          {path, "'layers.0.bias'", "int64[2]", "expects float32[2]"});
  EXPECT_EQ(model.parameter("layers.0.weight").to_vector<float>(), before);
}

// A save that fails halfway (here: the file-size limit, as a full disk would) throws, leaves the
// previous file byte for byte, and leaves no temporary behind.
TEST(BadInput, AFailedSaveKeepsThePreviousFile) {
  const fs::path dir = temp_dir("atomic-save");
  const std::string path = (dir / "w.safetensors").string();
  optim::save_safetensors(path, {{"small", full({4}, 1.5)}});
  const auto good = read_file_bytes(path);

  signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead of killing us
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  try {
    optim::save_safetensors(path, {{"big", Tensor::zeros({1 << 16})}});
    ADD_FAILURE() << "the save should have failed";
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("File too large"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_EQ(read_file_bytes(path), good);
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"w.safetensors"});
  // A saved file has the mode an ordinary create gives (mkstemp alone would make it 0600).
  const mode_t mask = umask(0);
  umask(mask);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask);

  expect_error<FileError>(
      [&] { optim::save_safetensors((dir / "no/such/dir/w.safetensors").string(), {}); },
      {"no/such/dir", "No such file or directory"});
  expect_error<FileError>([&] { optim::save_safetensors(dir.string(), {}); }, {"is a directory"});
  // Two tensors of one name would make a file no reader takes: refused before the file is touched.
  for (const char* name : {"small", "__metadata__"}) {
    expect_error<ValueError>(
        [&] {
          optim::save_safetensors(path, {{"small", full({4}, 2.5)}, {name, full({2}, 3.5)}},
                                  {{"format", "pt"}});
        },
        {"[safetensors]", path, std::string("two tensors are named '") + name + "'"});
    EXPECT_EQ(read_file_bytes(path), good);
  }
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"w.safetensors"});
}

// A module's parameters, buffers and children share one namespace: the saved weights are keyed by
// their dotted names, so a second registration of a name is refused.
TEST(BadInput, AModuleNameIsRegisteredOnce) {
  struct Twice : nn::Module {
    explicit Twice(int kind) {
      register_parameter("w", full({2}, 1.0));
      if (kind == 0) register_parameter("w", full({2}, 2.0));
      if (kind == 1) register_buffer("w", full({2}, 2.0));
      if (kind == 2) register_module("w", std::make_shared<nn::Linear>(2, 2));
    }
    Tensor forward(const Tensor& x) override { return x; }
  };
  for (int kind = 0; kind < 3; ++kind) {
    expect_error<ValueError>([&] { Twice t(kind); }, {"[Module] the name 'w' is registered twice"});
  }
}

// ---- command lines ----

struct CliCase {
  std::vector<std::string> args;
  std::vector<std::string> words;
};

// Every row exits 2 with one short line, before any data is read: --data points nowhere, so a
// row that got as far as loading would exit 1 complaining about the data instead.
TEST(BadInput, CommandLineMistakesExitTwoBeforeReadingData) {
  const fs::path dir = temp_dir("bad-cli");
  fs::create_symlink(dir / "loop-b", dir / "loop-a");
  fs::create_symlink(dir / "loop-a", dir / "loop-b");
  std::ofstream(dir / "best.safetensors") << "the user's file";  // --keep-best's row keeps it
  const std::vector<CliCase> table{
      {{"--lr", "nan"}, {"--lr", "nan", "not a finite number"}},
      {{"--lr", "inf"}, {"--lr", "inf"}},
      {{"--lr", "0"}, {"--lr", "'0' must be > 0"}},
      {{"--lr", "-1e-3"}, {"--lr"}},
      {{"--lr", "1e999"}, {"--lr"}},
      {{"--clip", "nan"}, {"--clip", "nan"}},
      {{"--clip", "-1"}, {"--clip", "'-1' must be >= 0"}},
      {{"--momentum", "nan"}, {"--momentum", "nan"}},
      {{"--momentum", "1"}, {"--momentum", "'1'"}},
      {{"--weight-decay", "nan"}, {"--weight-decay", "nan"}},
      {{"--weight-decay", "-0.1"}, {"--weight-decay"}},
      {{"--weight-decay", "1e39"}, {"--weight-decay", "'1e39' must be in [0, 3.40282e+38]"}},
      {{"--lr-scaling", "linear", "--base-batch", "1", "--lr", "1e307"},
       {"--lr 1e+307", "linear", "gives inf"}},
      {{"--epochs", "9223372036854775807"}, {"--epochs", "9223372036854775807"}},
      {{"--epochs", "-1"}, {"--epochs"}},
      {{"--micro-batch", "4611686018427387905", "--accum-steps", "4"}, {"--micro-batch"}},
      {{"--micro-batch", "2147483647", "--accum-steps", "4"}, {"--batch", "exceeds 2147483647"}},
      {{"--accum-steps", "-4"}, {"--accum-steps"}},
      {{"--zero", "1", "--bucket-kib", "64"}, {"--zero", "--bucket-kib"}},
      {{"--zero", "2", "--bucket-kib", "64"}, {"--zero", "--bucket-kib"}},
      {{"--zero", "4"}, {"--zero"}},
      {{"--zero", "3", "--model", "cnn"}, {"--zero 3", "--model cnn is not cut into layers"}},
      {{"--zero", "3", "--cuda-graphs", "on"}, {"--zero 3", "--cuda-graphs on"}},
      {{"--zero", "3", "--bucket-kib", "64"}, {"--zero", "--bucket-kib"}},
      {{"--zero", "3", "--pipeline", "2"}, {"--pipeline", "--zero"}},
      {{"--zero-reduce", "micro-step"}, {"--zero-reduce needs --zero 2", "--zero 0"}},
      {{"--zero", "1", "--zero-reduce", "boundary"}, {"--zero-reduce needs --zero 2", "--zero 1"}},
      {{"--zero", "2", "--zero-reduce", "sometimes"}, {"--zero-reduce", "sometimes"}},
      {{"--zero", "2", "--zero-reduce", "micro-step", "--cuda-graphs", "on"},
       {"--zero-reduce micro-step", "--cuda-graphs on"}},
      {{"--zero-prefetch", "forward"}, {"--zero-prefetch needs --zero 3", "--zero 0"}},
      {{"--zero", "2", "--zero-prefetch", "none"}, {"--zero-prefetch needs --zero 3", "--zero 2"}},
      {{"--zero", "3", "--zero-prefetch", "backward"}, {"--zero-prefetch", "backward"}},
      {{"--offload-optimizer=maybe"}, {"--offload-optimizer"}},
      {{"--pipeline", "0"}, {"--pipeline"}},
      {{"--pipeline", "2"}, {"--pipeline 2", "multiple of 2 ranks", "started 1"}},
      {{"--pipeline", "2", "--zero", "1"}, {"--pipeline", "--zero"}},
      {{"--pipeline", "2", "--zero", "2"}, {"--pipeline", "--zero"}},
      {{"--pipeline", "2", "--offload-optimizer"}, {"--pipeline", "--offload-optimizer"}},
      {{"--pipeline", "2", "--memory-budget", "64MiB"}, {"--pipeline", "--memory-budget"}},
      {{"--pipeline-schedule", "zigzag"}, {"--pipeline-schedule", "zigzag"}},
      {{"--precision", "fp8"}, {"--precision", "fp8"}},
      {{"--model", "resnet"}, {"--model", "resnet"}},
      {{"--memory-budget", "64MB"}, {"--memory-budget 64MB", "MiB"}},
      {{"--memory-budget", "-1GiB"}, {"--memory-budget -1GiB"}},
      {{"--memory-budget", "nanMiB"}, {"--memory-budget nanMiB"}},
      {{"--memory-budget", "1e30GiB"}, {"--memory-budget 1e30GiB", "at most 9e+18"}},
      {{"--memory-budget", "9223372036854775807"}, {"more bytes than any machine has"}},
      {{"--memory-budget", "0.5"}, {"--memory-budget 0.5", "at least 1 byte"}},
      {{"--memory-budget", "1.5"}, {"--memory-budget 1.5", "1.5 bytes is not a whole number"}},
      {{"--memory-budget", "1e-3KiB"}, {"1.024 bytes is not a whole number"}},
      {{"--memory-budget", "1.0000001KiB"}, {"1.0000001KiB: 1024.0001024", "not a whole number"}},
      {{"--memory-budget", "64MiB", "--micro-batch", "8"}, {"--memory-budget", "--micro-batch"}},
      {{"--accum-schedule", "2:2"}, {"--accum-schedule 2:2", "epoch 1"}},
      {{"--accum-schedule", "1:1,1:2"}, {"--accum-schedule", "increase"}},
      {{"--accum-schedule", "1:0"}, {"--accum-schedule", "k in [1"}},
      {{"--accum-schedule", "1:x"}, {"--accum-schedule", "positive integers"}},
      {{"--accum-schedule", "1:2,"}, {"--accum-schedule", "not epoch:k"}},
      {{"--accum-schedule", "1:99999999999999"}, {"--accum-schedule"}},
      {{"--accum-schedule", "1:1,2:2", "--accum-steps", "4"},
       {"--accum-schedule", "--accum-steps"}},
      {{"--accum-schedule", "1:1,3:2147483647"}, {"--batch", "exceeds"}},
      {{"--norm", "instance"}, {"--norm", "instance"}},
      {{"--norm", "batch"}, {"--norm batch", "--model cnn"}},
      {{"--resume", "/no/such/folder"}, {"--resume /no/such/folder", "no such folder"}},
      {{"--checkpoint-every", "0"}, {"--checkpoint-every"}},
      {{"--loss-scale", "nan"}, {"--loss-scale nan", "positive number"}},
      {{"--loss-scale", "-1024"}, {"--loss-scale -1024"}},
      {{"--loss-scale", "0"}, {"--loss-scale 0"}},
      {{"--loss-scale", "1e999"}, {"--loss-scale 1e999"}},
      {{"--loss-scale", "65536x"}, {"--loss-scale 65536x"}},
      {{"--loss-scale", ""}, {"--loss-scale"}},
      {{"--bucket-kib", "-1"}, {"--bucket-kib"}},
      {{"--batch", "100", "--micro-batch", "32"},
       {"batch 100", "not a multiple of 1 rank x micro-batch 32", "96 (k = 3", "128 (k = 4"}},
      {{"--train-limit", "-5"}, {"--train-limit"}},
      {{"--warmup", "-3"}, {"--warmup"}},
      {{"--threads", "-1"}, {"--threads"}},
      {{"--base-batch", "0"}, {"--base-batch"}},
      {{"--hidden", "99999999999"}, {"--hidden", "99999999999"}},
      {{"--hidden", ""}, {"--hidden"}},
      {{"--save", (dir / "missing/w.safetensors").string()},
       {"--save", "missing", "No such file or directory"}},
      {{"--save", dir.string()}, {"--save", "is a directory"}},
      {{"--save-init", dir.string()}, {"--save-init", "is a directory"}},
      {{"--save-init", (dir / "w.safetensors").string(), "--save",
        (dir / "w.safetensors").string()},
       {"--save", "--save-init", "name the same file"}},
      {{"--metrics", (dir / "missing/m.jsonl").string()}, {"--metrics", "No such file"}},
      {{"--init", (dir / "none.safetensors").string()},
       {"--init", "none.safetensors", "no such file"}},
      {{"--init", dir.string()}, {"--init", "is a directory"}},
      {{"--init", "/dev/zero"}, {"--init /dev/zero", "not a regular file"}},
      // A symbolic link loop is a clear error, not an uncaught filesystem_error (exit 134).
      {{"--resume", (dir / "loop-a").string()}, {"--resume", "loop-a", "symbolic links"}},
      {{"--init", (dir / "loop-a").string()}, {"--init", "loop-a", "symbolic links"}},
      // Found before the data, not after training (#22).
      {{"--precision", "fp16", "--loss-scale", "1e39"}, {"--loss-scale 1e39", "float32"}},
      {{"--loss-scale", "1e300"}, {"--loss-scale 1e300", "float32"}},
      {{"--loss-scale", "1e-45"}, {"--loss-scale 1e-45", "float32"}},
      {{"--loss-scale", "1e-320"}, {"--loss-scale 1e-320", "float32"}},
      {{"--hidden", "1048576,1048576"}, {"--hidden 1048576,1048576", "parameters", "GiB"}},
      {{"--hidden", "64,"}, {"--hidden", "'' in '64,'"}},
      {{"--hidden", ",64"}, {"--hidden", "'' in ',64'"}},
      {{"--hidden", "+64"}, {"--hidden", "'+64'"}},
      {{"--hidden", "0x40"}, {"--hidden", "'0x40'"}},
      {{"--micro-batch", "0x10"}, {"--micro-batch", "0x10"}},
      {{"--epochs", "+3"}, {"--epochs", "+3"}},
      {{"--seed", "-1"}, {"--seed", "'-1'"}},
      {{"--seed", "18446744073709551616"}, {"--seed", "18446744073709551616"}},
      {{"--seed", "0x5"}, {"--seed", "0x5"}},
      {{"--accum-schedule", ""}, {"--accum-schedule", "empty"}},
      {{"--memory-budget", ""}, {"--memory-budget", "empty"}},
      {{"--resume", ""}, {"--resume", "empty"}},
      {{"--init", ""}, {"--init", "empty"}},
      {{"--comm-timeout", "1e-320"}, {"--comm-timeout", "[1, 1e9]"}},
      {{"--comm-timeout", "nan"}, {"--comm-timeout"}},
      {{"--comm-timeout", "-5"}, {"--comm-timeout"}},
      // Numbers in plain decimal notation only: strtod would take hex and leading spaces.
      {{"--lr", "0x10"}, {"--lr", "'0x10'", "decimal notation"}},
      {{"--lr", "0x1p-10"}, {"--lr", "'0x1p-10'"}},
      {{"--lr", " 5"}, {"--lr", "' 5'"}},
      {{"--lr", "1e"}, {"--lr", "'1e'"}},
      {{"--clip", "0x1"}, {"--clip", "'0x1'"}},
      {{"--momentum", " 0.5"}, {"--momentum"}},
      {{"--weight-decay", "0x0"}, {"--weight-decay"}},
      {{"--comm-timeout", "0x10"}, {"--comm-timeout", "'0x10'"}},
      {{"--comm-timeout", " 10"}, {"--comm-timeout"}},
      {{"--loss-scale", "0x10"}, {"--loss-scale 0x10"}},
      {{"--loss-scale", " 1024"}, {"--loss-scale  1024"}},
      {{"--memory-budget", "0x10MiB"}, {"--memory-budget 0x10MiB"}},
      {{"--memory-budget", " 64MiB"}, {"--memory-budget  64MiB"}},
      {{"--memory-budget", "0x4p20"}, {"--memory-budget 0x4p20"}},
      // A value too small for a double is not 0, the "off" of these flags.
      {{"--clip", "1e-400"}, {"--clip", "'1e-400'", "too small"}},
      {{"--comm-timeout", "1e-400"}, {"--comm-timeout", "'1e-400'"}},
      {{"--device", "cuda:+0"}, {"cannot parse 'cuda:+0'"}},
      {{"--device", "cuda: 0"}, {"cannot parse 'cuda: 0'"}},
      {{"--device", "cuda:-0"}, {"cannot parse 'cuda:-0'"}},
      {{"--base-batch", "64"}, {"--base-batch", "--lr-scaling"}},
      // The optimizer applies the rate in float32: 1e308 is inf there, 1e-320 is 0.
      {{"--lr", "1e308"}, {"--lr 1e+308", "not a usable learning rate", "float32"}},
      {{"--lr", "1e-320"}, {"--lr", "not a usable learning rate", "float32"}},
      // A flag for a setting the run does not have changes nothing: a mistake, not a no-op.
      {{"--model", "cnn", "--hidden", "64"}, {"--hidden 64", "--model cnn"}},
      {{"--optimizer", "adam", "--momentum", "0.5"}, {"--momentum", "sgd", "adam"}},
      {{"--momentum", "0.5"}, {"--momentum", "sgd"}},
      {{"--checkpoint-every", "7"}, {"--checkpoint-every", "--checkpoint DIR"}},
      {{"--pipeline-schedule", "gpipe"}, {"--pipeline-schedule", "--pipeline 2"}},
      {{"--cuda-graphs", "maybe"}, {"--cuda-graphs", "maybe"}},
      {{"--cuda-graphs", "1"}, {"--cuda-graphs", "1"}},
      {{"--cuda-graphs", "on", "--device", "cpu"}, {"--cuda-graphs on", "needs a GPU", "cpu"}},
      // Evaluation during training and the best weights (#52 item 4).
      {{"--eval-every", "0"}, {"--eval-every", "'0'"}},
      {{"--eval-every", "-2"}, {"--eval-every"}},
      {{"--eval-every", "1e3"}, {"--eval-every", "1e3"}},
      {{"--early-stop", "0", "--eval-every", "5"}, {"--early-stop", "'0'"}},
      {{"--early-stop", "3"}, {"--early-stop", "--eval-every"}},
      {{"--keep-best", "--validation", "64"}, {"--keep-best", "--checkpoint DIR"}},
      {{"--keep-best", "--checkpoint", "/tmp/accrue-never-made"},
       {"--keep-best", "--validation N", "never the test set"}},
      {{"--early-stop", "2", "--eval-every", "5"}, {"--early-stop", "--validation N"}},
      {{"--validation", "-1"}, {"--validation"}},
      {{"--validation", "512", "--train-limit", "512"}, {"--validation 512", "--train-limit 512"}},
      {{"--keep-best", "--validation", "8", "--checkpoint", dir.string()},
       {"--keep-best", "best.safetensors exists and this run did not write it"}},
      {{"--keep-best", "--validation", "8", "--checkpoint", fs::temp_directory_path().string(),
        "--save", (fs::temp_directory_path() / "best.safetensors").string()},
       {"--save", "best.safetensors", "checkpoint writer's own file"}},
  };
  // Under a launcher's ranks (its environment, as mpirun sets it): a model --pipeline cannot cut
  // is found before the data is read (D10).
  struct LaunchedCase {
    std::string ranks;
    CliCase c;
  };
  for (const LaunchedCase& l : std::vector<LaunchedCase>{
           {"2", {{"--pipeline", "2", "--model", "cnn"}, {"--pipeline 2", "--model cnn"}}},
           {"4", {{"--pipeline", "4", "--hidden", "64"}, {"--pipeline 4", "--hidden 64 makes 2"}}},
       }) {
    ::setenv("OMPI_COMM_WORLD_SIZE", l.ranks.c_str(), 1);
    ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    std::vector<std::string> args = l.c.args;
    args.insert(args.end(), {"--data", "/nonexistent-accrue", "--quiet"});
    const CliResult r = cli(args);
    ::unsetenv("OMPI_COMM_WORLD_SIZE");
    ::unsetenv("OMPI_COMM_WORLD_RANK");
    EXPECT_EQ(r.status, 2) << r.err;
    for (const std::string& w : l.c.words) {
      EXPECT_NE(r.err.find(w), std::string::npos) << "'" << w << "' not in " << r.err;
    }
  }
  // Data behind a symbolic link loop: exit 1 naming the file, not an abort.
  const CliResult loop = cli({"--data", (dir / "loop-a").string(), "--quiet"});
  EXPECT_EQ(loop.status, 1) << loop.err;
  EXPECT_NE(loop.err.find("loop-a/train-images-idx3-ubyte"), std::string::npos) << loop.err;
  for (const CliCase& c : table) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--data", "/nonexistent-accrue"});
    const CliResult r = cli(args);
    SCOPED_TRACE(c.args[0] + " " + (c.args.size() > 1 ? c.args[1] : ""));
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_LT(r.err.size(), 300u) << r.err;
    EXPECT_EQ(r.err.find("nonexistent-accrue"), std::string::npos) << "read data: " << r.err;
    for (const std::string& w : c.words) {
      EXPECT_NE(r.err.find(w), std::string::npos) << "'" << w << "' not in " << r.err;
    }
  }
}

// An output naming one of the data's files (directly, through ./, a link or a hard link) would
// replace what the run reads: exit 2 before the data is read, the file as it was.
TEST(BadInput, AnOutputNamingADataFileIsRefused) {
  const fs::path data = make_dataset("output-is-data", 64, 16);
  const fs::path images = data / "train-images-idx3-ubyte";
  const std::string before = slurp(images);
  fs::create_symlink(images, data / "link");
  fs::create_hard_link(images, data / "hard-link");
  const std::string dotted = (data / "." / "train-images-idx3-ubyte").string();
  const std::string linked = (data / "link").string(), hard = (data / "hard-link").string();
  for (const std::string& flag : std::vector<std::string>{"--save", "--metrics", "--save-init"}) {
    for (const std::string& path : {images.string(), dotted, linked, hard}) {
      const CliResult r = cli({"--data", data.string(), flag, path, "--quiet"});
      EXPECT_EQ(r.status, 2) << r.err;
      expect_words(r.err, {flag + " " + path, "is the data file", "which the run reads"});
    }
  }
  EXPECT_EQ(slurp(images), before);
  fs::remove_all(data);
}

// A file's names may be a megabyte long or hold line breaks: the error is still one line, its
// start and end kept (the file's name, what is wrong), control characters escaped.
TEST(BadInput, ErrorsQuotingAFilesNamesStayOneShortLine) {
  const fs::path data = make_dataset("long-names", 256, 32);
  // "\\n" in the JSON text: a line break in the name
  const std::string name = "line1\\nline2" + std::string(100000, 'n');
  const std::string init = (data / "names.safetensors").string();
  write_bytes(init,
              safetensors(R"({")" + name + R"(":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})",
                          std::string(1, '\0')));
  const CliResult r = cli({"--data", data.string(), "--init", init, "--quiet"});
  EXPECT_EQ(r.status, 1) << r.err.substr(0, 300);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err.substr(0, 300);
  EXPECT_LT(r.err.size(), 700u) << r.err.substr(0, 300);
  for (const std::string& w : {init, std::string("line1\\nline2"), std::string("characters cut"),
                               std::string("unsupported dtype")}) {
    EXPECT_NE(r.err.find(w), std::string::npos) << w << " not in " << r.err.substr(0, 700);
  }
  EXPECT_EQ(train::printable_line("a\tb\x01"), "a\\tb\\x01");
  fs::remove_all(data);
}

// Weights that overflow the first layer make every gradient non-finite: every step is skipped,
// the run exits 1 saying so, writes nothing with --save, and the metrics say "nan" (not null).
TEST(BadInput, ARunWithoutAnyAppliedUpdateFails) {
  const fs::path data = make_dataset("all-skipped", 256, 32);
  nn::MLP huge({784, 32, 10});
  for (Tensor p : huge.parameters()) fill_(p, 1e38);
  const std::string init = (data / "huge.safetensors").string();
  optim::save_safetensors(init, huge.named_parameters());
  const std::string save = (data / "out.safetensors").string();
  const std::string metrics = (data / "m.jsonl").string();
  const CliResult r = cli({"--data", data.string(), "--hidden", "32", "--init", init, "--save",
                           save, "--metrics", metrics, "--epochs", "1", "--quiet"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no update was applied: all 2 steps were skipped"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(save));
  std::ifstream in(metrics);
  std::string first;
  std::getline(in, first);  // the run's id
  EXPECT_NE(first.find(R"("event":"run")"), std::string::npos) << first;
  std::getline(in, first);  // the first step
  EXPECT_NE(first.find(R"("loss":"nan")"), std::string::npos) << first;
  EXPECT_NE(first.find(R"("skipped":true)"), std::string::npos) << first;
}

// A fixed loss scale so small that fp16 gradients underflow to zero: every step is finite, none
// moves a weight. The run exits 1 naming the loss scale, and saves nothing.
TEST(BadInput, ARunWhoseEveryGradientIsZeroFailsNamingTheLossScale) {
  const fs::path data = make_dataset("zero-gradient", 256, 32);
  const std::string save = (data / "out.safetensors").string();
  const CliResult r = cli({"--data", data.string(), "--hidden", "32", "--precision", "fp16",
                           "--loss-scale", "1e-30", "--save", save, "--epochs", "1", "--quiet"});
  EXPECT_EQ(r.status, 1) << r.err;
  for (const std::string w : {"no update was applied: all 2 steps this run took had a gradient "
                              "norm of 0",
                              "loss scale 1e-30", "raise --loss-scale", "nothing saved"}) {
    EXPECT_NE(r.err.find(w), std::string::npos) << w << " not in " << r.err;
  }
  EXPECT_FALSE(fs::exists(save));
  fs::remove_all(data);
}

// --save-init writes the weights the first step starts from: a run started from them with
// --init trains to the same bits as the run that wrote them (whatever its seed: without shuffling
// the seed only draws the initial weights).
TEST(BadInput, SaveInitIsWhatTheFirstStepStartsFrom) {
  const fs::path data = make_dataset("save-init", 256, 32);
  const std::string init = (data / "init.safetensors").string();
  const std::string first = (data / "first.safetensors").string();
  const std::string second = (data / "second.safetensors").string();
  const std::vector<std::string> recipe = {"--data",   data.string(), "--hidden",     "32",
                                           "--epochs", "1",           "--no-shuffle", "--quiet"};
  std::vector<std::string> a = recipe, b = recipe;
  a.insert(a.end(), {"--save-init", init, "--save", first});
  b.insert(b.end(), {"--init", init, "--seed", "7", "--save", second});
  ASSERT_EQ(cli(a).status, 0);
  ASSERT_EQ(cli(b).status, 0);
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_NE(bytes(init), bytes(first));  // training moved the weights
  EXPECT_EQ(bytes(first), bytes(second));
}

// A FIFO where a file is read (data, a checkpoint's JSON) is refused at once, never waited on.
TEST(BadInput, AFifoIsRefusedWithoutBlocking) {
  const fs::path dir = temp_dir("fifo");
  const std::string images = (dir / "train-images-idx3-ubyte").string();
  ASSERT_EQ(::mkfifo(images.c_str(), 0600), 0);
  expect_error<FileError>([&] { mnist::read_idx_images(images); }, {images, "not a regular file"});
  const fs::path ckpt = dir / "ckpt";
  fs::create_directories(ckpt);
  ASSERT_EQ(::mkfifo((ckpt / "step-0000000001.json").c_str(), 0600), 0);
  expect_error<FileError>([&] { train::read_latest_checkpoint(ckpt.string()); },
                          {"step-0000000001.json", "not a regular file"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace accrue::testing
