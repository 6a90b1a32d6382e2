import XCTest

@testable import TrunkCrypto

final class SecureRandomTests: XCTestCase {
    func testBytesHaveTheRequestedCount() {
        XCTAssertEqual(SecureRandom.bytes(count: 0), [])
        XCTAssertEqual(SecureRandom.bytes(count: -1), [])
        XCTAssertEqual(SecureRandom.bytes(count: 1).count, 1)
        XCTAssertEqual(SecureRandom.bytes(count: 100_000).count, 100_000)
    }

    func testBytesDifferBetweenCalls() {
        // Two equal 32-byte draws happen with probability 2⁻²⁵⁶.
        let first = SecureRandom.bytes(count: 32)
        let second = SecureRandom.bytes(count: 32)
        XCTAssertNotEqual(first, second)
        // All 32 bytes equal to the first: probability 2⁻²⁴⁸.
        XCTAssertFalse(first.allSatisfy { $0 == first[0] })
    }

    func testDigitsAreSixDecimalDigits() {
        var sawLeadingZero = false
        for _ in 0..<1000 {
            let code = SecureRandom.digits(6)
            XCTAssertEqual(code.utf8.count, 6, code)
            XCTAssertTrue(code.utf8.allSatisfy { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }, code)
            sawLeadingZero = sawLeadingZero || code.hasPrefix("0")
        }
        // Leading zeros are kept, not dropped as by formatting a number: 1000 codes without
        // one happen with probability 0.9¹⁰⁰⁰ ≈ 10⁻⁴⁶.
        XCTAssertTrue(sawLeadingZero)
        XCTAssertEqual(SecureRandom.digits(0), "")
        XCTAssertEqual(SecureRandom.digits(-3), "")
    }

    func testUniformDigitsPassAChiSquareTest() {
        let draws = 100_000
        var counts = [Int](repeating: 0, count: 10)
        for _ in 0..<draws {
            counts[Int(SecureRandom.uniform(upperBound: 10))] += 1
        }
        let expected = Double(draws) / 10
        let chiSquare = counts.reduce(0.0) { sum, count in
            sum + (Double(count) - expected) * (Double(count) - expected) / expected
        }
        // With uniform draws the statistic follows χ² with 9 degrees of freedom (mean 9,
        // standard deviation about 4.2); P(χ²₉ > 80) ≈ 1.6 × 10⁻¹³, so a correct generator
        // fails this once in several trillion runs. Gross bugs land far above: a digit
        // that never comes out gives about 11 000.
        XCTAssertLessThan(chiSquare, 80, "counts \(counts)")
        XCTAssertTrue(counts.allSatisfy { $0 > 0 }, "counts \(counts)")
    }

    func testUniformStaysBelowTheBound() {
        XCTAssertEqual(SecureRandom.uniform(upperBound: 0), 0)
        XCTAssertEqual(SecureRandom.uniform(upperBound: 1), 0)
        for bound: UInt32 in [2, 3, 10, 1_000_000, UInt32.max / 2 + 1, UInt32.max] {
            for _ in 0..<100 {
                XCTAssertLessThan(SecureRandom.uniform(upperBound: bound), bound)
            }
        }
    }

    func testRejectionSamplingDiscardsTheSurplusWords() {
        // 2³² mod 10 = 6: the words 0…5 would make 0…5 more likely than 6…9, so they are
        // redrawn; 6 is the first word kept, and maps to 6.
        var words: [UInt32] = [0, 5, 6]
        XCTAssertEqual(SecureRandom.uniform(upperBound: 10) { words.removeFirst() }, 6)
        XCTAssertTrue(words.isEmpty)

        words = [UInt32.max, 7]
        XCTAssertEqual(SecureRandom.uniform(upperBound: 10) { words.removeFirst() }, UInt32.max % 10)
        XCTAssertEqual(words, [7])

        // A power of two divides 2³² evenly: nothing is rejected.
        words = [0]
        XCTAssertEqual(SecureRandom.uniform(upperBound: 16) { words.removeFirst() }, 0)

        // 2³² mod (2³¹ + 1) = 2³¹ − 1: everything below it is rejected.
        let bound = UInt32(1) << 31 + 1
        words = [0, bound - 3, bound - 2]
        XCTAssertEqual(SecureRandom.uniform(upperBound: bound) { words.removeFirst() }, bound - 2)
        XCTAssertTrue(words.isEmpty)
    }
}
