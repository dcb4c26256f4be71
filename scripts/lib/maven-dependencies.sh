# Sourced by scripts/servers.d/*.sh: fetch a pom's runtime dependencies from Maven Central.
#
#   maven_dependencies NAME POM DEST REQUIRED_JAR...
#
# Leaves DEST alone when it is complete (a .complete marker and every required jar present);
# otherwise installs a JDK and Maven if missing, fetches into DEST.partial and moves it into
# place only once every required jar is there, so an interrupted fetch is never mistaken for a
# finished one.

_maven_complete() {
  local folder=$1
  shift
  [ -e "$folder/.complete" ] || return 1
  local jar
  for jar in "$@"; do
    [ -s "$folder/$jar" ] || return 1
  done
}

maven_dependencies() {
  local name=$1 pom=$2 dest=$3
  shift 3
  if _maven_complete "$dest" "$@"; then
    echo "$name already installed"
    return 0
  fi
  local tool
  for tool in java mvn; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "installing a JDK and Maven (Debian packages)"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jdk-headless maven >/dev/null
      break
    fi
  done
  local partial="$PWD/$dest.partial"
  rm -rf "$partial"
  mkdir -p "$partial"
  local command=(mvn -q -B -f "$pom"
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies
    -DincludeScope=runtime "-DoutputDirectory=$partial")
  "${command[@]}"
  echo "${command[*]}" >"$partial/.complete"
  if ! _maven_complete "$partial" "$@"; then
    echo "$name: Maven did not fetch $* into $partial ($(ls "$partial" | tr '\n' ' '))" >&2
    return 1
  fi
  rm -rf "$dest"
  mv "$partial" "$dest"
}
