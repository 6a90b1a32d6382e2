/// The version of this trunk-sync build (`trunk-sync --version`, the console's overview).
public enum TrunkSyncVersion {
    /// Semantic version; `-dev` until a release is tagged.
    public static let current = "0.1.0-dev"
}
