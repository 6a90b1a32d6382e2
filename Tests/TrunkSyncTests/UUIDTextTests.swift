import Foundation
import XCTest

@testable import TrunkSync

/// UUIDs as text without Foundation's `sscanf`/`snprintf`: the same values, stricter input.
final class UUIDTextTests: XCTestCase {
    func testParsesTheCanonicalFormInEitherCase() {
        let id = UUID()
        XCTAssertEqual(UUIDText.parse(id.uuidString), id)
        XCTAssertEqual(UUIDText.parse(id.uuidString.lowercased()), id)
        XCTAssertEqual(
            UUIDText.parse("00000000-0000-4000-8000-0000000000ff"),
            UUID(uuidString: "00000000-0000-4000-8000-0000000000FF"))
    }

    func testRefusesEveryOtherSpelling() {
        for text in [
            "", "6f1f0e3c11114c3e9d7a3a1c8f0f2b10", "{6f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b10}",
            "6f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b1", "6f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b100",
            "6f1f0e3c-1111-4c3e-9d7a_3a1c8f0f2b10", "6f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b1g",
            "6f1f0e3c-111-14c3e-9d7a-3a1c8f0f2b10", " f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b10",
            "6f1f0e3c-1111-4c3e-9d7a-3a1c8f0f2b1é",
        ] {
            XCTAssertNil(UUIDText.parse(text), text)
        }
    }

    func testWritesWhatFoundationWritesInLowercase() {
        for _ in 0..<1000 {
            let id = UUID()
            XCTAssertEqual(UUIDText.lowercase(id), id.uuidString.lowercased())
            XCTAssertEqual(UUIDText.parse(UUIDText.lowercase(id)), id)
        }
    }
}
